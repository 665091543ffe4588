"""The engine's vocabulary: names and rules every layer shares (statuses and their sets).

Nothing here imports storage, the runtime, the API, the graph or the capabilities; they import
from here, so a rule such as "which statuses are final" is written once, below all of them.

Its modules are its parts, each imported by the layers above: `task` (the task and the plan)
with `steps` (a step and its checks), `jobs` (a job, its result and verification), `records`
(what storage returns), `status` (the statuses and their sets), `values` (the base model, JSON
and parsing) and `patterns` (the RE2 patterns of checks). The most used names are here too.
"""

from workflow_engine.domain.jobs import (
    Finding,
    JobRequest,
    JobResult,
    JobStatus,
    Limits,
    Sandbox,
    Verification,
)
from workflow_engine.domain.records import Fence, Lease, WorkflowRecord
from workflow_engine.domain.status import TERMINAL_STATUSES, WorkflowStatus
from workflow_engine.domain.task import AcceptanceCriterion, Budget, Check, Plan, Step, TaskSpec
from workflow_engine.domain.values import JsonObject, parse

__all__ = [
    "TERMINAL_STATUSES",
    "AcceptanceCriterion",
    "Budget",
    "Check",
    "Fence",
    "Finding",
    "JobRequest",
    "JobResult",
    "JobStatus",
    "JsonObject",
    "Lease",
    "Limits",
    "Plan",
    "Sandbox",
    "Step",
    "TaskSpec",
    "Verification",
    "WorkflowRecord",
    "WorkflowStatus",
    "parse",
]
