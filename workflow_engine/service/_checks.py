"""The checks a use case makes against a workflow's row before it takes or changes anything.

Whether a caller's scope admits a workflow (another tenant's reads as one that does not exist),
whether another writer blocked it, and what a resume asks to change: pure functions of the row,
shared by the use cases (`_workflows`) and the event stream (`_watch`).
"""

from __future__ import annotations

from workflow_engine._clock import Clock
from workflow_engine.domain.records import Scope, WorkflowRecord
from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.domain.task import Budget
from workflow_engine.errors import InvalidState, WorkflowNotFound
from workflow_engine.graph import changes as state_changes
from workflow_engine.graph.changes import Change, Decision
from workflow_engine.graph.state import WorkflowState, state_or_empty


def admits(scope: Scope | None, user_id: str, project_id: str) -> bool:
    return scope is None or scope.admits(user_id, project_id)


def in_scope(record: WorkflowRecord, scope: Scope | None) -> WorkflowRecord:
    """`record`, or the NOT_FOUND of a workflow that does not exist when `scope` does not
    admit it: another tenant cannot tell that it exists."""
    if scope is not None and not scope.admits(record.user_id, record.project_id):
        raise WorkflowNotFound(record.task_id)
    return record


def refuse_blocked(record: WorkflowRecord) -> None:
    """Refuse to run or change a workflow another writer changed (`blocked_reason`)."""
    if record.blocked_reason and not record.terminal:
        raise InvalidState(f"task {record.task_id} is blocked: {record.blocked_reason}")


def state_of(record: WorkflowRecord) -> WorkflowState:
    """The record's state; a tampered one (not of its form) reads as empty, refused by the run."""
    return state_or_empty(record.state)


def resume_changes(
    record: WorkflowRecord,
    decision: Decision | None,
    budget: Budget | None,
    actor: str,
    clock: Clock,
) -> list[Change]:
    """What a ResumeWorkflow asks to change, checked against the row before anything is taken.

    A workflow SUSPENDED because its approval request expired needs no budget (the step asks
    again); any other SUSPENDED one needs the budget that raises the limit it hit. A tampered
    state is not validated here: the run refuses the checkpoint itself.
    """
    state = state_of(record)
    if record.status == WorkflowStatus.WAITING_FOR_APPROVAL and decision is None:
        raise InvalidState(
            "decision: required; the workflow waits for approval of step "
            f"{(state.get('pending_approval') or {}).get('step_id')!r}"
        )
    expired = (state.get("wait_expired") or {}).get("cause") == "approval_timeout"
    if record.status == WorkflowStatus.SUSPENDED and budget is None and not expired:
        raise InvalidState("budget: required; the workflow is SUSPENDED: " + (record.summary or ""))
    if budget is not None and record.terminal:
        raise InvalidState(f"budget: the workflow has ended ({record.status})")
    changes: list[Change] = []
    if decision is not None:
        changes.append(lambda state: state_changes.decide(state, decision, clock.now()))
    if budget is not None:
        changes.append(lambda state: state_changes.raise_budget(state, budget, actor))
    elif record.status == WorkflowStatus.SUSPENDED:
        changes.append(lambda state: state_changes.resume_after_expiry(state, actor))
    state_changes.apply_all(changes, state)  # refuse now what does not fit
    return changes
