"""OpenTelemetry traces: one trace per workflow run, a span per node, job and model call.

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set and
``OTEL_SDK_DISABLED`` is not true: then `enable_tracing` (called by `serve`) installs the SDK's
tracer provider with a batching OTLP/gRPC exporter, configured by OpenTelemetry's own
``OTEL_*`` variables (service name, headers, sampler, ...). While off, the API's default
provider hands out non-recording spans: a no-op call per span.

A call's trace context (the ``traceparent`` metadata of W3C Trace Context, as OpenTelemetry's
gRPC clients send it) becomes the parent of the call's server span, and so of the run a
``StartWorkflow`` or ``ResumeWorkflow`` launches: the run's task inherits the context.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import structlog
from opentelemetry import context, propagate, trace

log = structlog.get_logger(__name__)

TRACER_NAME = "workflow_engine"
_provider: Any = None
#: The engine's tracer once tracing is on; None while off (every span is then a no-op).
_tracer: trace.Tracer | None = None


def enabled() -> bool:
    """Whether this process records and exports spans."""
    return _tracer is not None


def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    kind: trace.SpanKind = trace.SpanKind.INTERNAL,
) -> AbstractContextManager[trace.Span]:
    """A span around a block, current within it; while tracing is off, nothing at all."""
    if _tracer is None:
        return nullcontext(trace.INVALID_SPAN)
    return _tracer.start_as_current_span(name, kind=kind, attributes=attributes)


def start_span(name: str, attributes: Mapping[str, Any] | None = None) -> trace.Span:
    """A span the caller ends (`trace.use_span` makes it current); off: a no-op span."""
    if _tracer is None:
        return trace.INVALID_SPAN
    return _tracer.start_span(name, attributes=attributes)


def tracing_requested(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    if environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def enable_tracing() -> bool:
    """Install the SDK and its OTLP exporter when the environment asks for it; True if so."""
    global _provider, _tracer
    if _provider is not None or not tracing_requested():
        return _provider is not None
    # Imported here: a process that does not trace never loads the SDK or the exporter.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create(
        {SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME", "workflow-engine")}
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _provider = provider
    _tracer = provider.get_tracer(TRACER_NAME)
    log.info("tracing_enabled", exporter="otlp/grpc")
    return True


def shutdown_tracing() -> None:
    """Send what is buffered and stop the exporter (at the end of `serve`)."""
    if _provider is not None:
        _provider.shutdown()


@contextmanager
def incoming(metadata: Any) -> Iterator[None]:
    """Make the trace context in a call's metadata (``traceparent``...) the current one."""
    carrier = {key: value for key, value in metadata or () if isinstance(value, str)}
    token = context.attach(propagate.extract(carrier)) if carrier else None
    try:
        yield
    finally:
        if token is not None:
            context.detach(token)
