"""What the engine tells the outside about itself while it runs: metrics and traces.

An engine's `metrics.Metrics` counts and times what operators watch (Prometheus, on
``WORKFLOW_ENGINE_METRICS_LISTEN``); `tracing` follows one workflow run through its nodes, jobs
and model calls (OpenTelemetry, when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set). Both are off
until the process that serves turns them on, and cost a no-op call each while off. Every other
layer may use them; they import nothing of the engine. The two modules are what it offers.
"""

from workflow_engine.telemetry import _metrics as metrics
from workflow_engine.telemetry import _tracing as tracing

__all__ = ["metrics", "tracing"]
