"""Each WorkflowEngine call, measured and traced: `rpc_server_call_duration_seconds` by method
and status code, and a server span whose parent is the caller's trace context (if it sent one).

Installed only while metrics or tracing are on, outermost, so it also sees the calls that
authentication refuses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from opentelemetry import trace

from workflow_engine.api._interceptors import Behavior, MethodInterceptor
from workflow_engine.telemetry import Metrics, tracing


class TelemetryInterceptor(MethodInterceptor):
    def __init__(self, service: str, metrics: Metrics) -> None:
        super().__init__(service)
        self._service = service
        self._metrics = metrics  # the engine's

    def _span(self, method: str) -> Any:
        return tracing.span(
            f"{self._service}/{method}",
            {"rpc.system": "grpc", "rpc.service": self._service, "rpc.method": method},
            trace.SpanKind.SERVER,
        )

    def wrap_unary(self, method: str, inner: Behavior) -> Behavior:
        async def behavior(request: Any, context: Any) -> Any:
            started = time.perf_counter()
            with tracing.incoming(context.invocation_metadata()), self._span(method) as span:
                try:
                    answer = await inner(request, context)
                except BaseException as exc:
                    _ended(self._metrics, method, context, span, started, exc)
                    raise
                _ended(self._metrics, method, context, span, started, None)
                return answer

        return behavior

    def wrap_stream(self, method: str, inner: Behavior) -> Behavior:
        async def behavior(request: Any, context: Any) -> AsyncIterator[Any]:
            started = time.perf_counter()
            with tracing.incoming(context.invocation_metadata()), self._span(method) as span:
                try:
                    async for item in inner(request, context):
                        yield item
                except BaseException as exc:
                    _ended(self._metrics, method, context, span, started, exc)
                    raise
                _ended(self._metrics, method, context, span, started, None)

        return behavior


def _ended(
    metrics: Metrics,
    method: str,
    context: Any,
    span: Any,
    started: float,
    error: BaseException | None,
) -> None:
    """Record the call's duration and code: the one the servicer set or aborted with, else OK,
    CANCELLED when the client went away, UNKNOWN for anything else that ended it."""
    code = context.code()
    if code is None:
        if isinstance(error, asyncio.CancelledError | GeneratorExit):
            code = grpc.StatusCode.CANCELLED
        else:
            code = grpc.StatusCode.OK if error is None else grpc.StatusCode.UNKNOWN
    elif not isinstance(code, grpc.StatusCode):
        code = next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
    metrics.rpc(method, code.value[0], time.perf_counter() - started)
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code != grpc.StatusCode.OK:
        span.set_status(trace.Status(trace.StatusCode.ERROR, code.name))
