"""Where the graph goes next, and which steps can run. Pure functions of the state (and, for the
deadline, of the time), so they are tested on their own.

A plan whose steps name no `depends_on` runs in order: each step depends on the one before. Once
any step names one, the steps form a graph and a step with no `depends_on` can start at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.graph.state import StepState, WorkflowState

AfterLoad = Literal["plan_steps", "mark_failed"]
AfterPlan = Literal["dispatch_step", "finalize_summary", "mark_failed"]
AfterDispatch = Literal["collect_result", "finalize_summary", "mark_failed", "__end__"]
AfterVerify = Literal[
    "plan_steps", "dispatch_step", "finalize_summary", "mark_failed", "suspend_workflow"
]

IN_FLIGHT = ("dispatched", "collected")


def plan_steps(state: WorkflowState) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = state.get("plan", {}).get("steps", [])
    return steps


def is_graph(steps: Sequence[Mapping[str, Any]]) -> bool:
    """True when the plan's steps form a graph (some step names `depends_on`)."""
    return any(step.get("depends_on") for step in steps)


def dependencies(steps: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, ...]]:
    """Each step's prerequisites: its `depends_on`, or the step before it in a sequential plan."""
    if is_graph(steps):
        return {step["id"]: tuple(step.get("depends_on") or ()) for step in steps}
    return {step["id"]: (steps[i - 1]["id"],) if i else () for i, step in enumerate(steps)}


def step_state(state: WorkflowState, step_id: str) -> StepState:
    return state.get("steps", {}).get(step_id) or {"status": "pending", "attempts": 0}


def in_flight(state: WorkflowState) -> list[str]:
    return [s["id"] for s in plan_steps(state) if step_state(state, s["id"])["status"] in IN_FLIGHT]


def ready(state: WorkflowState) -> list[str]:
    """Steps that may be dispatched now: pending, with every prerequisite passed; plan order."""
    steps = plan_steps(state)
    deps = dependencies(steps)
    return [
        s["id"]
        for s in steps
        if step_state(state, s["id"])["status"] == "pending"
        and all(step_state(state, d)["status"] == "passed" for d in deps[s["id"]])
    ]


def budget_exhausted(
    state: WorkflowState, now: float, step_id: str | None = None, dispatched: int | None = None
) -> str:
    """Why no further job may be dispatched (for `step_id`, when given); empty when one may.

    `dispatched` counts the jobs dispatched so far when the state's count is out of date.
    """
    budget = state.get("budget") or {}
    dispatches = int(budget.get("max_dispatches") or 0)
    used = state.get("dispatches", 0) if dispatched is None else dispatched
    if dispatches and used >= dispatches:
        return f"the budget of {dispatches} dispatch(es) is used up"
    tokens = int(budget.get("max_model_tokens") or 0)
    if tokens and int(state.get("model_tokens") or 0) >= tokens:
        return f"the budget of {tokens} model token(s) is used up"
    deadline = int(budget.get("deadline_seconds") or 0)
    if deadline and now >= float(state.get("started_at") or now) + deadline:
        return f"the deadline of {deadline} s after the start has passed"
    consecutive = int(budget.get("max_consecutive_attempts") or 0)
    if consecutive:
        for sid in [step_id] if step_id else ready(state):
            if step_state(state, sid).get("attempts", 0) >= consecutive:
                return f"step {sid} reached the budget of {consecutive} consecutive attempt(s)"
    return ""


def after_load(state: WorkflowState) -> AfterLoad:
    """Plan, unless loading the task failed (the node raised)."""
    return "mark_failed" if state.get("forced_next") == "mark_failed" else "plan_steps"


def after_plan(state: WorkflowState) -> AfterPlan:
    """An empty plan cannot satisfy the task: fail rather than claim success."""
    if state.get("error"):
        return "mark_failed"
    if not plan_steps(state):
        return "mark_failed"
    return "dispatch_step"


def after_dispatch(state: WorkflowState) -> AfterDispatch:
    """Collect what was dispatched; stop here while a step waits for approval."""
    forced = state.get("forced_next")
    if forced == "finalize_summary":
        return "finalize_summary"
    if forced == "mark_failed":
        return "mark_failed"
    if state.get("status") == WorkflowStatus.WAITING_FOR_APPROVAL.in_state:
        return "__end__"
    return "collect_result"


def after_verify(state: WorkflowState, now: float) -> AfterVerify:
    """Dispatch more (next steps, retries) or collect what runs; else finish, fail or suspend.

    A step that failed verification is `pending` again while attempts remain, `failed` when
    none do, and one failed step fails the workflow.
    """
    forced = state.get("forced_next")
    if forced == "finalize_summary":
        return "finalize_summary"
    if forced == "mark_failed":
        return "mark_failed"
    if state.get("wait_expired"):  # a wait for approval expired: suspended, and why
        return "suspend_workflow"
    if not plan_steps(state):  # a change applied before planning: plan, never "all passed"
        return "mark_failed" if state.get("error") else "plan_steps"
    statuses = [step_state(state, s["id"])["status"] for s in plan_steps(state)]
    if "failed" in statuses:
        return "mark_failed"
    if all(status == "passed" for status in statuses):
        return "finalize_summary"
    if in_flight(state):
        return "dispatch_step"  # it dispatches what budget and limits allow, then collects
    if ready(state):
        return "suspend_workflow" if budget_exhausted(state, now) else "dispatch_step"
    return "mark_failed"  # nothing runs and nothing can: unreachable with a valid plan


#: Where the graph goes after `verify_step_result`'s router, as the status it leads to.
_ROUTE_STATUS = {
    "finalize_summary": WorkflowStatus.SUCCEEDED,
    "mark_failed": WorkflowStatus.FAILED,
    "suspend_workflow": WorkflowStatus.SUSPENDED,
}


def committed_status(state: WorkflowState, now: float) -> WorkflowStatus:
    """The status a workflow has or is bound for, just after a change applied to `state`.

    A change is applied as `verify_step_result`, whose router picks the next node; a forced
    `mark_failed` is FAILED from then on, even before that node has run.
    """
    status = WorkflowStatus.of_state(state.get("status"))
    if status != WorkflowStatus.RUNNING:
        return status
    return _ROUTE_STATUS.get(after_verify(state, now), WorkflowStatus.RUNNING)
