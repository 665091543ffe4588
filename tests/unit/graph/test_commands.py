"""Decisions, budgets and overrides are pure functions of the state: refused or an update."""

from __future__ import annotations

import pytest

from workflow_engine.domain import Budget
from workflow_engine.errors import InvalidArgument, InvalidState
from workflow_engine.graph import changes, routing
from workflow_engine.graph.changes import Decision
from workflow_engine.graph.state import WorkflowState

PLAN = {
    "steps": [
        {"id": "build", "command": ["make"], "expect": []},
        {"id": "ship", "command": ["ship", "it"], "requires_approval": True, "expect": []},
    ]
}


def waiting() -> WorkflowState:
    return {
        "status": "waiting_for_approval",
        "plan": PLAN,
        "steps": {"build": {"status": "passed", "attempts": 1}, "ship": {"status": "pending"}},
        "pending_approval": {"step_id": "ship", "command": ["ship", "it"]},
        "approvals": {},
        "max_attempts_per_step": 3,
    }


def test_approve_clears_the_request_and_records_who() -> None:
    update = changes.decide(waiting(), Decision("ship", "approve", decided_by="alice"), 0.0)
    assert update.values["status"] == "running" and update.values["pending_approval"] is None
    assert update.values["approvals"]["ship"]["decided_by"] == "alice"
    assert (update.kind, update.actor) == ("approval_decided", "alice")


def test_reject_fails_the_step_and_so_the_workflow() -> None:
    update = changes.decide(waiting(), Decision("ship", "reject", reason="not today"), 0.0)
    state: WorkflowState = {**waiting(), **update.values}
    assert state["steps"]["ship"]["status"] == "failed"
    assert routing.committed_status(state, 0) == "FAILED"


def test_edit_replaces_the_command_and_is_checked() -> None:
    update = changes.decide(waiting(), Decision("ship", "edit", command=("echo", "staged")), 0.0)
    assert update.values["plan"]["steps"][1]["command"] == ["echo", "staged"]
    with pytest.raises(InvalidArgument, match=r"^decision\[1\].command\[0\]"):
        changes.decide(waiting(), Decision("ship", "edit", command=("",)), 0.0)


@pytest.mark.parametrize(
    ("state", "decision", "phrase"),
    [
        (waiting(), Decision("build", "approve"), "not 'build'"),
        ({**waiting(), "status": "running"}, Decision("ship", "approve"), "no pending approval"),
    ],
)
def test_a_decision_that_does_not_fit_is_refused(
    state: WorkflowState, decision: Decision, phrase: str
) -> None:
    with pytest.raises(InvalidState, match=phrase):
        changes.decide(state, decision, 0.0)


def test_a_second_decision_is_refused_by_the_state_the_first_left() -> None:
    first = lambda s: changes.decide(s, Decision("ship", "approve"), 0.0)  # noqa: E731
    _, after = changes.apply_all([first], waiting())
    with pytest.raises(InvalidState, match="no pending approval"):
        changes.apply_all([first], after)


def test_raise_budget_continues_a_suspended_workflow() -> None:
    state: WorkflowState = {"status": "suspended", "budget": {"max_dispatches": 3}}
    update = changes.raise_budget(state, Budget(max_dispatches=10), "ops")
    assert update.values["budget"]["max_dispatches"] == 10
    assert update.values["status"] == "running"


def test_force_branch_commits_to_its_status() -> None:
    base: WorkflowState = {"status": "running", "plan": PLAN, "steps": {}}
    for branch, status in [("mark_failed", "FAILED"), ("finalize_summary", "SUCCEEDED")]:
        update = changes.force_branch(base, branch, "op", "why")  # type: ignore[arg-type]
        assert routing.committed_status({**base, **update.values}, 0) == status


def test_reject_last_result_gives_exactly_one_more_attempt() -> None:
    state: WorkflowState = {
        "status": "running",
        "plan": PLAN,
        "last_step_id": "build",
        "max_attempts_per_step": 1,
        "steps": {"build": {"status": "passed", "attempts": 1}},
        "results": [{"step_id": "build"}],
        "context": {"build": {}},
    }
    update = changes.reject_last_result(state, "carol", "bad build")
    assert update.values["steps"]["build"]["status"] == "pending"
    assert update.values["max_attempts_per_step"] == 2
    assert update.values["results"] == [] and update.values["context"] == {}
