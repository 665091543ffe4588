"""States as the engine wrote them before the state was typed still read, and write back the same.

`fixtures/states_c4739ac.json` holds the `state` column of real checkpoint rows the engine wrote
at commit c4739ac (logged by a trigger while integration tests of approvals, budgets, overrides,
parallel steps and the llm planner ran): a fresh start, a workflow waiting for approval (of a
task's step, and of a model-planned one), a decision, a retried step in flight, a suspended and a
budget-raised workflow, a rejected result, revisions, model calls.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from workflow_engine.domain.jobs import Finding, JobResult, Verification
from workflow_engine.domain.task import Budget, Plan, Step
from workflow_engine.domain.values import DomainModel
from workflow_engine.graph.state import (
    STATE_KEYS,
    BudgetRecord,
    JobResultRecord,
    PlanRecord,
    VerificationRecord,
    as_record,
    read_state,
    state_or_empty,
)

FIXTURE = Path(__file__).parent / "fixtures" / "states_c4739ac.json"
ROWS: dict[str, Any] = json.loads(FIXTURE.read_text())


def as_stored(state: Any) -> str:
    """The state as its jsonb column compares it: keys in any order."""
    return json.dumps(state, sort_keys=True)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_a_stored_state_reads_and_writes_back_unchanged(name: str) -> None:
    stored = ROWS[name]["state"]
    state = read_state(stored)
    assert as_stored(state) == as_stored(stored)
    assert set(state) <= STATE_KEYS


def test_the_fixtures_hold_what_they_say() -> None:
    waiting = read_state(ROWS["waiting_for_approval"]["state"])
    assert (waiting.get("pending_approval") or {}).get("step_id") == "deploy"
    assert read_state(ROWS["budget_raised"]["state"])["budget"]["max_dispatches"] == 10
    retried = read_state(ROWS["retried_step_in_flight"]["state"])["steps"]["flaky"]
    assert (retried["status"], retried["attempts"]) == ("dispatched", 2)
    planned = read_state(ROWS["revised_step_waiting_for_approval"]["state"])
    assert planned["model_calls"] and planned["revisions"]


def test_a_state_of_the_wrong_form_is_refused_naming_nothing_it_holds() -> None:
    stored = ROWS["waiting_for_approval"]["state"]
    for broken in (
        {**stored, "steps": {"deploy": {"status": "sideways"}}},
        {**stored, "dispatches": "many"},
        {**stored, "pending_approval": {"command": "rm -rf /"}},
    ):
        with pytest.raises(ValidationError):
            read_state(broken)
        assert state_or_empty(broken) == {}


def test_keys_of_no_known_form_are_kept() -> None:
    stored = ROWS["approval_decided"]["state"]
    extra = {**stored, "steps": {"deploy": {"status": "pending", "attempts": 0, "later": [1]}}}
    assert read_state(extra)["steps"]["deploy"] == {
        "status": "pending",
        "attempts": 0,
        "later": [1],
    }


RESULT = JobResult(
    task_id="t",
    job_id="j",
    status="failed",
    exit_code=2,
    stdout="out",
    stderr="err",
    started_at="2026-01-01T00:00:00.000Z",
    ended_at="2026-01-01T00:00:01.000Z",
    work_dir="/srv/jobs/j",
    target="node-1",
    artifacts=({"name": "log", "size_bytes": 3},),
)
VERIFICATION = Verification(
    status="fail",
    findings=(Finding(check="exit_code", passed=False, detail="got 2"),),
    recommended_actions=("fix it",),
)
PLAN = Plan(steps=(Step(id="a", command=("true",)),), assumptions=("none",))
BUDGET = Budget(max_dispatches=3, max_consecutive_attempts=2, deadline_seconds=60)


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        (JobResultRecord, RESULT),
        (VerificationRecord, VERIFICATION),
        (PlanRecord, PLAN),
        (BudgetRecord, BUDGET),
    ],
)
def test_a_domain_values_json_is_its_record(kind: Any, value: DomainModel) -> None:
    """`as_record` checks nothing: the record forms must be the domain models' JSON, field for
    field, so a field added to a model is added to its record (and typed) too."""
    assert set(kind.__annotations__) == set(type(value).model_fields)
    record = as_record(kind, value)
    assert TypeAdapter(kind).validate_python(record) == record == value.to_json()
