"""Fault plans (the fault suite's injection), on their own."""

from __future__ import annotations

import pytest

from workflow_engine._faults import FaultPlan, InjectedDatabaseError
from workflow_engine.storage import is_transient


def test_a_fault_fires_once_at_its_occurrence_and_looks_transient() -> None:
    plan = FaultPlan.parse("dberror:before:plan_steps#2, dberror:renew:*")
    plan.at("before", "plan_steps")  # the first occurrence passes
    with pytest.raises(InjectedDatabaseError) as fired:
        plan.at("before", "plan_steps")
    assert is_transient(fired.value)
    plan.at("before", "plan_steps")  # fired once, never again
    with pytest.raises(InjectedDatabaseError):
        plan.at("renew", "anything")
    assert plan.fired == 2


@pytest.mark.parametrize("spec", ["dberror:before", "explode:before:x", "dberror:nowhere:x"])
def test_a_bad_fault_spec_names_the_setting(spec: str) -> None:
    with pytest.raises(ValueError, match="WORKFLOW_ENGINE_FAULTS"):
        FaultPlan.parse(spec)


def test_an_empty_plan_is_inert() -> None:
    plan = FaultPlan.parse("")
    assert not plan
    plan.at("before", "plan_steps")
