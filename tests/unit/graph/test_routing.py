"""Which steps may run, and where the graph goes after planning, dispatch and verification."""

from __future__ import annotations

from typing import Any

import pytest

from workflow_engine.graph.routing import (
    after_dispatch,
    after_load,
    after_plan,
    after_verify,
    budget_exhausted,
    dependencies,
    ready,
)

NOW = 1_000_000.0


def state(*statuses: str, attempts: int = 1, max_attempts: int = 3, **extra: Any) -> Any:
    """A sequential plan s0, s1, ... whose steps are in `statuses`."""
    return {
        "plan": {"steps": [{"id": f"s{i}"} for i in range(len(statuses))]},
        "steps": {f"s{i}": {"status": st, "attempts": attempts} for i, st in enumerate(statuses)},
        "max_attempts_per_step": max_attempts,
        **extra,
    }


def graph_state(deps: dict[str, list[str]], statuses: dict[str, str]) -> Any:
    return {
        "plan": {"steps": [{"id": sid, "depends_on": d} for sid, d in deps.items()]},
        "steps": {sid: {"status": st, "attempts": 0} for sid, st in statuses.items()},
        "max_parallel_steps": 4,
    }


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        (state("passed", "pending"), "dispatch_step"),  # next step
        (state("passed", "passed"), "finalize_summary"),
        (state("pending", "pending", attempts=2), "dispatch_step"),  # retry
        (state("failed", "pending"), "mark_failed"),  # attempts exhausted at s0
        (state("passed", "dispatched"), "dispatch_step"),  # collect what runs
        (state("pending", budget={"max_dispatches": 1}, dispatches=1), "suspend_workflow"),
        (state("pending", attempts=2, budget={"max_consecutive_attempts": 2}), "suspend_workflow"),
        (state("pending", budget={"deadline_seconds": 5}, started_at=NOW - 6), "suspend_workflow"),
        (state("pending", budget={"deadline_seconds": 5}, started_at=NOW - 4), "dispatch_step"),
        (state("pending", forced_next="mark_failed"), "mark_failed"),
        (state("pending", forced_next="finalize_summary"), "finalize_summary"),
    ],
)
def test_after_verify(s: Any, expected: str) -> None:
    assert after_verify(s, NOW) == expected


def test_after_load_fails_when_loading_raised() -> None:
    assert after_load({}) == "plan_steps"
    assert after_load({"forced_next": "mark_failed"}) == "mark_failed"


def test_after_plan() -> None:
    assert after_plan({"plan": {"steps": [{"id": "a"}]}}) == "dispatch_step"
    assert after_plan({"plan": {"steps": []}}) == "mark_failed"
    assert after_plan({"plan": {"steps": [{"id": "a"}]}, "error": "bad plan"}) == "mark_failed"


def test_after_dispatch_ends_the_graph_while_waiting_for_approval() -> None:
    assert after_dispatch(state("dispatched")) == "collect_result"
    assert after_dispatch(state("pending", status="waiting_for_approval")) == "__end__"
    assert after_dispatch(state("dispatched", forced_next="mark_failed")) == "mark_failed"


def test_a_plan_without_depends_on_runs_in_order() -> None:
    assert dependencies([{"id": "a"}, {"id": "b"}, {"id": "c"}]) == {
        "a": (),
        "b": ("a",),
        "c": ("b",),
    }
    assert ready(state("pending", "pending")) == ["s0"]
    assert ready(state("passed", "pending", "pending")) == ["s1"]


def test_independent_steps_are_ready_together_and_dependents_wait() -> None:
    deps = {"a": [], "b": [], "c": [], "d": ["a", "b", "c"]}
    pending = {sid: "pending" for sid in deps}
    assert ready(graph_state(deps, pending)) == ["a", "b", "c"]
    running = {**pending, "a": "passed", "b": "dispatched"}
    assert ready(graph_state(deps, running)) == ["c"]
    assert ready(graph_state(deps, {**pending, "a": "passed", "b": "passed", "c": "passed"})) == [
        "d"
    ]


def test_budget_reasons_name_the_limit() -> None:
    assert budget_exhausted(state("pending"), NOW) == ""
    assert "2 dispatch" in budget_exhausted(
        state("pending", budget={"max_dispatches": 2}, dispatches=2), NOW
    )
    assert "deadline" in budget_exhausted(
        state("pending", budget={"deadline_seconds": 1}, started_at=NOW - 2), NOW
    )
