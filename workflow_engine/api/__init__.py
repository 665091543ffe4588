"""The gRPC surface: request parsing, the servicer, and the exception-to-status mapping.

What the engine wires into its server (`__all__`): the servicer, the health servicer, the
interceptors (authentication, telemetry), the request reader and decoding handler, and the
reflection pool. Its modules are its own: `_requests` reads a request into the domain,
`_convert` and `_listing` write the answers, `_limits` bounds every list and map, `_roles` and
`_auth` decide who may call what, `_status_codes` maps errors to status codes, `_schedules`
does both for schedules.
"""

from workflow_engine.api._auth import Authenticator, AuthInterceptor, Callers
from workflow_engine.api._call_metrics import TelemetryInterceptor
from workflow_engine.api._decoding import generic_handler
from workflow_engine.api._health import HealthServicer
from workflow_engine.api._reading import RequestReader
from workflow_engine.api._reflection import CommentedPool
from workflow_engine.api._servicer import WorkflowEngineServicer

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
