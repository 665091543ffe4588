"""The workflow's state: what every node reads and writes, and what the checkpoint stores.

All values are JSON (the `state` column of `workflow_checkpoints`). The first eight keys are the
orchestrator's state model; the rest are the engine's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.domain.values import JsonObject
from workflow_engine.secrets import state_secrets

#: Where one step is. ``pending``: not dispatched, or to be tried again; ``dispatched``: its job
#: is recorded and may be running; ``collected``: its result awaits verification; ``passed`` and
#: ``failed`` are final.
StepStatus = Literal["pending", "dispatched", "collected", "passed", "failed"]


class StepState(TypedDict, total=False):
    status: StepStatus
    attempts: int
    job: JsonObject | None  # {"target", "request"} of the attempt in flight
    result: JsonObject | None  # its job result, once collected
    verification: JsonObject | None  # the last verification of this step
    error: str  # why it failed, when it did without a verification (e.g. rejected)


class WorkflowState(TypedDict, total=False):
    # The orchestrator's state model.
    task_id: str
    acceptance_criteria: list[JsonObject]
    preferences_effective: JsonObject
    plan: JsonObject  # {"steps": [...], "assumptions": [...]}
    current_step_index: int  # the first step (in plan order) that has not passed
    attempts_by_step: dict[str, int]
    last_result: JsonObject | None
    verification: JsonObject | None  # {"status", "findings", "recommended_actions"}
    # The engine's additions.
    status: str  # a `WorkflowStatus`, `in_state` spelling: running, waiting_for_approval...
    prompt: str
    metadata: JsonObject
    max_attempts_per_step: int
    max_parallel_steps: int
    budget: JsonObject  # {"max_dispatches", "max_consecutive_attempts", "deadline_seconds"}
    started_at: float  # epoch seconds of the first start, for the deadline
    dispatches: int  # jobs dispatched so far, all steps and attempts
    steps: dict[str, StepState]  # per step: status, attempts, job, result, verification
    current_job: JsonObject | None  # the job dispatched last
    last_step_id: str  # the step whose result is `last_result`
    approvals: dict[str, JsonObject]  # step id -> the decision that answered its request
    pending_approval: JsonObject | None  # the request a WAITING_FOR_APPROVAL workflow waits on
    context: dict[str, JsonObject]  # step id -> its output, for the steps after it
    forced_next: str | None  # an operator's forced branch: finalize_summary | mark_failed
    results: list[JsonObject]  # one record per step that passed, in the order they passed
    summary: str
    error: str
    # Every secret value the workflow's plans have had, sorted; it only grows, so what a step
    # printed stays masked after its plan changed (see `workflow_engine.secrets`). Not shown.
    secrets: list[str]
    # Model calls (the llm planner and verifier): one record per call (node, purpose, model,
    # latency_ms, prompt_tokens, completion_tokens), their tokens in all, and the steps the
    # planner revised after a failed verification (step_id, attempt, reason, commands).
    model_calls: list[JsonObject]
    model_tokens: int
    revisions: list[JsonObject]


STATE_KEYS: frozenset[str] = frozenset(WorkflowState.__annotations__)


#: What an accepted outside state keeps (see `accepted_state`): the orchestrator's own record of
#: the last result and its verification. Everything else is re-read (task) or re-planned.
ACCEPTED_KEYS = ("last_result", "verification")


def accepted_state(task_id: str, outside: Mapping[str, Any]) -> WorkflowState:
    """The state a blocked workflow starts again from when an operator accepts what another
    writer wrote into it: a fresh start (the task is read again and re-planned) that keeps their
    last result and verification, when they are JSON objects, and every secret it has had."""
    state = initial_state(task_id)
    for key in ACCEPTED_KEYS:
        value = outside.get(key)
        if isinstance(value, dict):
            state[key] = value  # type: ignore[literal-required]
    if secrets := state_secrets(outside):
        state["secrets"] = sorted(secrets)
    return state


def initial_state(task_id: str) -> WorkflowState:
    """The state a workflow starts from, before `load_task_context` fills it in."""
    return {
        "task_id": task_id,
        "status": WorkflowStatus.RUNNING.in_state,
        "acceptance_criteria": [],
        "preferences_effective": {},
        "plan": {"steps": [], "assumptions": []},
        "current_step_index": 0,
        "attempts_by_step": {},
        "last_result": None,
        "verification": None,
        "current_job": None,
        "steps": {},
        "dispatches": 0,
        "approvals": {},
        "pending_approval": None,
        "context": {},
        "results": [],
        "summary": "",
        "error": "",
    }
