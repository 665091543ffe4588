"""A server interceptor that wraps each method of one service once, for every call after.

`AuthInterceptor` (who may call) and `TelemetryInterceptor` (how long, which code, which
trace) are two: each says how to wrap a unary and a streaming method's behaviour.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

#: A method's behaviour, as grpc.aio calls it: (request, context) -> answer, or an async
#: iterator of answers.
Behavior = Callable[..., Any]


class MethodInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Wraps the methods of `service` with `wrap_unary` / `wrap_stream`; others pass."""

    def __init__(self, service: str) -> None:
        self._prefix = f"/{service}/"
        # Method path -> (the service's handler, its wrapped copy): made once per method, not
        # on every call (the service's handlers never change).
        self._wrapped: dict[str, tuple[Any, grpc.RpcMethodHandler[Any, Any]]] = {}

    def wrap_unary(self, method: str, inner: Behavior) -> Behavior:
        raise NotImplementedError

    def wrap_stream(self, method: str, inner: Behavior) -> Behavior:
        raise NotImplementedError

    def request_deserializer(self, handler: grpc.RpcMethodHandler[Any, Any]) -> Any:
        """What turns a wrapped method's request bytes into the request its behaviour gets:
        the service's own deserializer, unless an interceptor decodes later itself."""
        return handler.request_deserializer

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(details)
        method_path: str = details.method
        if handler is None or not method_path.startswith(self._prefix):
            return handler  # health, reflection, unknown methods
        known = self._wrapped.get(method_path)
        if known is None or known[0] is not handler:
            known = (handler, self._wrap(method_path[len(self._prefix) :], handler))
            self._wrapped[method_path] = known
        return known[1]

    def _wrap(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self.wrap_unary(method, handler.unary_unary),
                request_deserializer=self.request_deserializer(handler),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self.wrap_stream(method, handler.unary_stream),
                request_deserializer=self.request_deserializer(handler),
                response_serializer=handler.response_serializer,
            )
        return handler
