"""Approval timeouts and the workflow deadline of a wait, on a clock the test sets: when a
request expires, the row's `wake_at`, and the change that applies the expiry (before, at and
after its time, and after a decision got there first). Nothing sleeps."""

from __future__ import annotations

from typing import cast

import pytest

from tests.support.clock import ManualClock
from workflow_engine.domain import Step
from workflow_engine.domain.deadlines import (
    Expiry,
    approval_expiry,
    effective_timeout,
    expiry_of,
    wake_at,
)
from workflow_engine.errors import InvalidState
from workflow_engine.graph import changes, routing
from workflow_engine.graph._nodes.dispatching import approval_request
from workflow_engine.graph.changes import Decision
from workflow_engine.graph.state import WorkflowState

SHIP = {"id": "ship", "command": ["ship", "it"], "requires_approval": True, "expect": []}
PLAN = {"steps": [{"id": "build", "command": ["make"], "expect": []}, SHIP]}


def running(**extra: object) -> WorkflowState:
    state = {
        "status": "running",
        "plan": PLAN,
        "steps": {"build": {"status": "passed", "attempts": 1}, "ship": {"status": "pending"}},
        "approvals": {},
        "max_attempts_per_step": 3,
        "started_at": 1000.0,
        "budget": {},
        **extra,
    }
    return cast(WorkflowState, state)


def waiting(
    clock: ManualClock, step: dict[str, object] | None = None, **extra: object
) -> WorkflowState:
    """The state `dispatch_step` leaves when `ship` asks for approval at the clock's now."""
    state = running(**extra)
    request = approval_request(state, Step.from_json({**SHIP, **(step or {})}), clock.now())
    return {**state, **request}


def test_the_earlier_of_the_timeout_and_the_deadline_and_the_deadline_wins_a_tie() -> None:
    def at(timeout: int, deadline: int) -> Expiry | None:
        return approval_expiry(
            requested_at=100.0,
            timeout_seconds=timeout,
            action="reject",
            started_at=50.0,
            deadline_seconds=deadline,
        )

    assert at(0, 0) is None
    assert at(10, 0) == Expiry(110.0, "reject", "approval_timeout", 10)
    assert at(0, 100) == Expiry(150.0, "suspend", "deadline", 100)
    assert at(10, 100) == Expiry(110.0, "reject", "approval_timeout", 10)
    assert at(10, 60) == Expiry(110.0, "suspend", "deadline", 60)  # a tie: the deadline
    assert at(60, 10) == Expiry(60.0, "suspend", "deadline", 10)  # already past at the request


def test_a_step_s_own_timeout_and_action_before_the_task_s_and_reject_by_default() -> None:
    assert effective_timeout(5, None, 60, "suspend") == (5, "suspend")
    assert effective_timeout(0, "suspend", 60, None) == (60, "suspend")
    assert effective_timeout(0, None, 60, None) == (60, "reject")
    assert effective_timeout(0, None, 0, None) == (0, "reject")


def test_the_request_stores_its_expiry_and_the_row_wakes_then() -> None:
    clock = ManualClock()
    now = clock.now()
    state = waiting(clock, {"approval_timeout_seconds": 30, "on_approval_timeout": "suspend"})
    pending = state["pending_approval"]
    assert pending is not None
    assert pending["expires_at"] == now + 30
    assert pending["on_timeout"] == "suspend"
    assert wake_at(state) == now + 30
    # The task's default, for a step without its own (a model-planned one).
    task_default = waiting(clock, approval_timeout_seconds=7)
    assert wake_at(task_default) == now + 7
    assert (task_default["pending_approval"] or {})["on_timeout"] == "reject"
    # Never, without a timeout or a deadline; and a row that does not wait never wakes.
    forever = waiting(clock)
    assert "expires_at" not in (forever["pending_approval"] or {})
    assert wake_at(forever) is None
    assert wake_at(running(approval_timeout_seconds=7)) is None


def test_the_deadline_caps_the_request_and_always_suspends() -> None:
    clock = ManualClock()
    state = waiting(
        clock,
        {"approval_timeout_seconds": 3600},
        started_at=clock.now() - 50,
        budget={"deadline_seconds": 60},
    )
    assert (state["pending_approval"] or {})["expires_at"] == clock.now() + 10
    assert (state["pending_approval"] or {})["on_timeout"] == "suspend"
    # An operator raises the deadline while it waits: the expiry follows the budget as it is.
    raised = {**state, "budget": {"deadline_seconds": 10_000}}
    assert wake_at(raised) == clock.now() + 3600
    assert expiry_of(raised) == Expiry(clock.now() + 3600, "reject", "approval_timeout", 3600)


def test_the_expiry_is_refused_before_its_time_and_applied_at_and_after_it() -> None:
    clock = ManualClock()
    state = waiting(clock, {"approval_timeout_seconds": 2})
    clock.advance(1.999)
    with pytest.raises(InvalidState, match="not yet"):
        changes.expire(state, "ship", clock.now())
    clock.advance(0.001)
    at = changes.expire(state, "ship", clock.now())
    clock.advance(100)
    later = changes.expire(state, "ship", clock.now())
    for update in (at, later):
        assert update.kind == "approval_decided"
        assert update.actor == "deadline"
        assert (
            update.detail == "reject step ship: the approval request of step ship expired after 2 s"
        )
        assert update.values["steps"]["ship"]["status"] == "failed"
        assert update.values["approvals"]["ship"]["decided_by"] == "deadline"
        assert update.values["pending_approval"] is None
        after: WorkflowState = {**state, **update.values}
        assert routing.after_verify(after, clock.now()) == "mark_failed"


def test_a_decision_first_makes_the_expiry_refused_and_the_expiry_first_the_decision() -> None:
    clock = ManualClock()
    state = waiting(clock, {"approval_timeout_seconds": 2})
    clock.advance(2)
    decided = changes.decide(state, Decision("ship", "approve", decided_by="alice"), clock.now())
    with pytest.raises(InvalidState, match="no pending approval request"):
        changes.expire({**state, **decided.values}, "ship", clock.now())
    expired = changes.expire(state, "ship", clock.now())
    with pytest.raises(InvalidState, match="no pending approval request"):
        changes.decide({**state, **expired.values}, Decision("ship", "approve"), clock.now())


def test_an_expiry_for_another_step_or_a_request_that_never_expires_is_refused() -> None:
    clock = ManualClock()
    state = waiting(clock, {"approval_timeout_seconds": 2})
    clock.advance(10)
    with pytest.raises(InvalidState, match="for step 'ship', not 'build'"):
        changes.expire(state, "build", clock.now())
    with pytest.raises(InvalidState, match="never expires"):
        changes.expire(waiting(clock), "ship", clock.now())


def test_suspend_leads_to_suspend_workflow_and_resuming_asks_again() -> None:
    clock = ManualClock()
    state = waiting(clock, {"approval_timeout_seconds": 2, "on_approval_timeout": "suspend"})
    clock.advance(2)
    update = changes.expire(state, "ship", clock.now())
    assert update.detail.startswith("suspend step ship: the approval request of step ship")
    after: WorkflowState = {**state, **update.values}
    assert "ship" not in after["approvals"]  # it asks again when resumed
    assert after["wait_expired"] == {
        "step_id": "ship",
        "cause": "approval_timeout",
        "reason": "the approval request of step ship expired after 2 s",
    }
    assert routing.after_verify(after, clock.now()) == "suspend_workflow"
    suspended: WorkflowState = {**after, "status": "suspended"}
    resumed: WorkflowState = {**suspended, **changes.resume_after_expiry(suspended, "ops").values}
    assert resumed["wait_expired"] is None
    assert routing.after_verify(resumed, clock.now()) == "dispatch_step"


def test_the_deadline_suspends_a_wait_and_needs_a_budget_to_resume() -> None:
    clock = ManualClock()
    state = waiting(clock, started_at=clock.now(), budget={"deadline_seconds": 5})
    clock.advance(5)
    update = changes.expire(state, "ship", clock.now())
    reason = "the deadline of 5 s after the start passed while step ship waited for approval (5 s)"
    assert update.detail == f"suspend step ship: {reason}"
    after: WorkflowState = {**state, **update.values, "status": "suspended"}
    assert after["wait_expired"] == {"step_id": "ship", "cause": "deadline", "reason": reason}
    with pytest.raises(InvalidState, match="budget: required"):
        changes.resume_after_expiry(after, "ops")
