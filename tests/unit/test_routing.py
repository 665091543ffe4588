"""Where the graph goes after planning and after verification."""

from __future__ import annotations

from typing import Any

import pytest

from workflow_engine.graph.routing import after_plan, after_verify


def state(index: int, verdict: str, attempts: int, max_attempts: int = 3, steps: int = 2) -> Any:
    return {
        "plan": {"steps": [{"id": f"s{i}"} for i in range(steps)]},
        "current_step_index": index,
        "verification": {"status": verdict},
        "attempts_by_step": {f"s{min(index, steps - 1)}": attempts},
        "max_attempts_per_step": max_attempts,
    }


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        (state(1, "pass", 1), "dispatch_step"),  # step 0 passed, index moved to 1
        (state(2, "pass", 1), "finalize_summary"),  # last step passed
        (state(0, "fail", 1), "dispatch_step"),  # retry
        (state(0, "fail", 2), "dispatch_step"),
        (state(0, "fail", 3), "mark_failed"),  # attempts exhausted
        (state(1, "fail", 1, max_attempts=1), "mark_failed"),
    ],
)
def test_after_verify(s: Any, expected: str) -> None:
    assert after_verify(s) == expected


def test_after_plan() -> None:
    assert after_plan({"plan": {"steps": [{"id": "a"}]}}) == "dispatch_step"
    assert after_plan({"plan": {"steps": []}}) == "mark_failed"
    assert after_plan({"plan": {"steps": [{"id": "a"}]}, "error": "bad plan"}) == "mark_failed"
