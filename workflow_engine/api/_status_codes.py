"""The one mapping from the engine's exceptions to gRPC status codes.

Client mistakes get the code that tells the client what to do (fix the request, wait for the
lease, look elsewhere); a database that is down is UNAVAILABLE, so clients retry; only a bug in
the engine is INTERNAL, and it is logged with its traceback.
"""

from __future__ import annotations

import grpc
import psycopg
import structlog

from workflow_engine._masking import Secrets, for_workflow
from workflow_engine.errors import (
    CheckpointCorrupt,
    InvalidArgument,
    InvalidState,
    LeaseHeld,
    LeaseLost,
    OutOfScope,
    ResourceExhausted,
    RunControl,
    ScheduleExists,
    ScheduleNotFound,
    ShuttingDown,
    TaskNotFound,
    TaskNotStartable,
    TaskSourceUnavailable,
    WorkflowEngineError,
    WorkflowExists,
    WorkflowNotFound,
)
from workflow_engine.storage import is_transient

log = structlog.get_logger(__name__)

_CODES: list[tuple[type[WorkflowEngineError | RunControl], grpc.StatusCode]] = [
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (WorkflowNotFound, grpc.StatusCode.NOT_FOUND),
    (ScheduleNotFound, grpc.StatusCode.NOT_FOUND),
    (ScheduleExists, grpc.StatusCode.ALREADY_EXISTS),
    (OutOfScope, grpc.StatusCode.PERMISSION_DENIED),
    (TaskNotFound, grpc.StatusCode.NOT_FOUND),
    (TaskNotStartable, grpc.StatusCode.FAILED_PRECONDITION),
    (TaskSourceUnavailable, grpc.StatusCode.UNAVAILABLE),
    (WorkflowExists, grpc.StatusCode.ALREADY_EXISTS),
    (LeaseHeld, grpc.StatusCode.FAILED_PRECONDITION),
    (LeaseLost, grpc.StatusCode.ABORTED),
    (InvalidState, grpc.StatusCode.FAILED_PRECONDITION),
    (ShuttingDown, grpc.StatusCode.UNAVAILABLE),
    (ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (CheckpointCorrupt, grpc.StatusCode.DATA_LOSS),
]


def status_for(exc: BaseException, engine_secrets: Secrets) -> tuple[grpc.StatusCode, str]:
    """The status code and message a client sees for `exc`, the engine's credentials masked
    (not every secret the engine knows: a message quoting the caller's own words, masked with
    another workflow's secret, would tell the caller a guess was right)."""
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code, for_workflow(engine_secrets, ()).redact(exc.message)
    if is_transient(exc):
        return grpc.StatusCode.UNAVAILABLE, "database unavailable; retry"
    if isinstance(exc, psycopg.Error):
        log.error("database_error", error=repr(exc))
        return grpc.StatusCode.INTERNAL, "database error"
    log.exception("internal_error", exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal error"
