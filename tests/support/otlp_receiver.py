"""An OTLP/gRPC trace receiver, as an OpenTelemetry Collector's `otlp` receiver is one.

A real gRPC server on a free port implementing `TraceService.Export`; it keeps every span it
is sent, so a test can read what a traced engine process exported.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    service: str


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{port}"
        self._server.start()

    def Export(  # the generated servicer's name
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self._lock:
            for resource_spans in request.resource_spans:
                service = next(
                    (
                        a.value.string_value
                        for a in resource_spans.resource.attributes
                        if a.key == "service.name"
                    ),
                    "",
                )
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        self.spans.append(
                            Span(
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_id=span.parent_span_id.hex(),
                                name=span.name,
                                kind=span.kind,
                                attributes={a.key: _value(a.value) for a in span.attributes},
                                service=service,
                            )
                        )
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, name: str, timeout: float = 30) -> list[Span]:
        """The spans named `name`, once at least one has arrived."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                found = [s for s in self.spans if s.name == name]
            if found:
                return found
            time.sleep(0.05)
        raise TimeoutError(f"no span {name!r}; got {sorted({s.name for s in self.spans})}")

    def stop(self) -> None:
        self._server.stop(grace=1)


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None
