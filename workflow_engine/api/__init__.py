"""The gRPC surface: request parsing, the servicer, and the exception-to-status mapping.

What the engine wires into its server (`__all__`): the servicer, the health servicer, the
interceptors (authentication, telemetry), the request reader and decoding handler, and the
reflection pool. Everything else (`requests`, `convert`, `listing`, `limits`, `roles`,
`status_codes`, ...) is internal.
"""

from workflow_engine.api.auth import Authenticator, AuthInterceptor, Callers
from workflow_engine.api.call_metrics import TelemetryInterceptor
from workflow_engine.api.decoding import generic_handler
from workflow_engine.api.health import HealthServicer
from workflow_engine.api.reading import RequestReader
from workflow_engine.api.reflection import CommentedPool
from workflow_engine.api.servicer import WorkflowEngineServicer

__all__ = [
    "AuthInterceptor",
    "Authenticator",
    "Callers",
    "CommentedPool",
    "HealthServicer",
    "RequestReader",
    "TelemetryInterceptor",
    "WorkflowEngineServicer",
    "generic_handler",
]
