"""workflow-engine: a durable LangGraph workflow worker driven over gRPC, or run in-process.

The public surface: `Settings` to configure; `Engine` to run in a program's own event loop,
with `TaskSpec` and `Step` to say what to run and `WorkflowHandle` / `WorkflowResult` for what
comes of it; the errors a program catches from them (all `WorkflowEngineError`: every other
error lives in `workflow_engine.errors`); the gRPC contract in `workflow_engine.v1`. Everything
else is internal: a `_module` is the package's own, and each subpackage offers what the others
use in its `__init__` (see docs/architecture.md, "Packages and their faces").

    async with Engine(settings_from_env()) as engine:
        result = await engine.run(TaskSpec(steps=[Step(id="hi", command=["echo", "hi"])]))

`Engine` and its types are imported on first use: the client commands and the worker node
import this package too, and need none of the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workflow_engine.config import Settings, settings_from_env
from workflow_engine.domain.records import StartOutcome, WorkflowEventRecord, WorkflowRecord
from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.domain.task import Step, TaskSpec
from workflow_engine.errors import (
    ConfigError,
    InvalidArgument,
    InvalidState,
    LeaseHeld,
    ResourceExhausted,
    ShuttingDown,
    TaskNotFound,
    TaskNotStartable,
    TaskSourceUnavailable,
    WorkflowEngineError,
    WorkflowExists,
    WorkflowNotFound,
)
from workflow_engine.version import __version__ as __version__  # written there, once

if TYPE_CHECKING:
    from workflow_engine.engine import Engine, WorkflowHandle, WorkflowResult

__all__ = [
    "ConfigError",
    "Engine",
    "InvalidArgument",
    "InvalidState",
    "LeaseHeld",
    "ResourceExhausted",
    "Settings",
    "ShuttingDown",
    "StartOutcome",
    "Step",
    "TaskNotFound",
    "TaskNotStartable",
    "TaskSourceUnavailable",
    "TaskSpec",
    "WorkflowEngineError",
    "WorkflowEventRecord",
    "WorkflowExists",
    "WorkflowHandle",
    "WorkflowNotFound",
    "WorkflowRecord",
    "WorkflowResult",
    "WorkflowStatus",
    "__version__",
    "settings_from_env",
]

_LAZY = frozenset({"Engine", "WorkflowHandle", "WorkflowResult"})


def __getattr__(name: str) -> object:
    """`Engine`, `WorkflowHandle` and `WorkflowResult`, imported on first use."""
    if name in _LAZY:
        from workflow_engine import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'workflow_engine' has no attribute {name!r}")
