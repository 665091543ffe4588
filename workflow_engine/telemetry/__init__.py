"""What the engine tells the outside about itself while it runs: metrics and traces.

An engine's `Metrics` counts and times what operators watch (Prometheus, on
``WORKFLOW_ENGINE_METRICS_LISTEN``; `serve_metrics` serves them, `summed_registry` sums the
processes'); `tracing` follows one workflow run through its nodes, jobs and model calls
(OpenTelemetry, when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set). Both are off until the process
that serves turns them on, and cost a no-op call each while off. Every other layer may use
them; they import nothing of the engine.
"""

from workflow_engine.telemetry import tracing
from workflow_engine.telemetry._metrics import (
    MULTIPROC_ENV,
    Metrics,
    serve_metrics,
    summed_registry,
)

__all__ = [
    "MULTIPROC_ENV",
    "Metrics",
    "serve_metrics",
    "summed_registry",
    "tracing",
]
