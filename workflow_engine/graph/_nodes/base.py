"""What the nodes of every phase share: their capabilities, and the state's helpers.

`NodeBase` holds the capabilities and the jobs in flight; each phase's nodes are a class of
their own on it (`planning`, `dispatching`, `collecting`, `verifying`, `finishing`), and
`Nodes` is all of them.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import psycopg

from workflow_engine._masking import Secrets, for_workflow, state_secrets
from workflow_engine.capabilities import Capabilities, JobTracker
from workflow_engine.capabilities.model import Ledger, PolicyDecision
from workflow_engine.domain.jobs import JobRequest, JobResult
from workflow_engine.domain.task import Step
from workflow_engine.errors import RunControl, WorkflowEngineError
from workflow_engine.graph import routing
from workflow_engine.graph.state import ModelCallRecord, StepState, WorkflowState

#: Namespace of job ids: uuid5(JOB_NAMESPACE, "<task_id>/<run_id>/<step_id>/<attempt>"), or
#: "<task_id>/<step_id>/<attempt>" for a run with no id (started before state format 4).
JOB_NAMESPACE = uuid.UUID("5b0d7d0e-8f3c-4f7e-9a57-0e1f6c8a2b11")


def job_id_for(task_id: str, step_id: str, attempt: int, run_id: str = "") -> str:
    """The deterministic job id of one attempt at one step of one run.

    The same within a run (a resume sends the same id, and the worker answers with the first
    result), never the same across runs: a task id started again after its rows were pruned,
    perhaps by another tenant, gets none of the old run's results."""
    name = f"{task_id}/{run_id}/{step_id}/{attempt}" if run_id else f"{task_id}/{step_id}/{attempt}"
    return str(uuid.uuid5(JOB_NAMESPACE, name))


def is_control(exc: BaseException) -> bool:
    """What must stop the run rather than be recorded as the task's failure: a run-control
    signal (which no `except Exception` catches anyway), or a database that stayed unreachable
    beyond the retries (the checkpoint is intact; a resume continues)."""
    return isinstance(exc, RunControl | psycopg.Error)


class NodeBase:
    """The capabilities the nodes call, and the jobs they run."""

    def __init__(self, capabilities: Capabilities, jobs: JobTracker | None = None) -> None:
        self._caps = capabilities
        self._secrets = capabilities.context.secrets
        # The engine's one clock: every time a node records or compares comes from it.
        self._clock = capabilities.context.clock
        self.jobs = jobs or capabilities.jobs

    def _masking(self, state: WorkflowState) -> Secrets:
        """What text this workflow stores (or shows a model) is masked with: its own secrets
        and the engine's credentials, never another workflow's (`secrets.for_workflow`)."""
        return for_workflow(self._secrets, state_secrets(state))


def accounted(
    state: WorkflowState, update: WorkflowState, ledger: Ledger, node: str
) -> WorkflowState:
    """`update` with the model calls in `ledger` added to the state's records and total."""
    if ledger.calls:
        calls: list[ModelCallRecord] = [
            {
                "purpose": call.purpose,
                "model": call.model,
                "latency_ms": call.latency_ms,
                "prompt_tokens": call.prompt_tokens,
                "completion_tokens": call.completion_tokens,
                "node": node,
            }
            for call in ledger.calls
        ]
        update["model_calls"] = [*state.get("model_calls", []), *calls]
        update["model_tokens"] = int(state.get("model_tokens", 0)) + ledger.tokens
    return update


def steps_copy(state: WorkflowState) -> dict[str, StepState]:
    return {s["id"]: {**routing.step_state(state, s["id"])} for s in routing.plan_steps(state)}


def step_of(state: WorkflowState, step_id: str) -> Step:
    for data in routing.plan_steps(state):
        if data["id"] == step_id:
            return Step.from_json(data)
    raise KeyError(step_id)


def approval_policy(decision: PolicyDecision | None) -> StepState:
    """What a step's state records of the command policy's `decision` about it: the rule that
    makes it wait for approval, when one does (its approval request names it)."""
    if decision is not None and decision.verdict == "approve":
        return {"approval_policy": decision.reason}
    return {}


def worker_error_result(job: JobRequest, exc: BaseException, secrets: Secrets) -> JobResult:
    # The engine's own errors say what happened in their message; anything else by its repr.
    error = exc.message if isinstance(exc, WorkflowEngineError) else secrets.masked_repr(exc)
    now = datetime.now(UTC).isoformat()
    return JobResult(
        task_id=job.task_id,
        job_id=job.job_id,
        status="failed",
        exit_code=None,
        stdout="",
        stderr=f"worker error: {error}",
        started_at=now,
        ended_at=now,
    )
