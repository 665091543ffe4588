"""The orchestrator's task as the engine's TaskSpec: what is read, and what is not startable."""

from __future__ import annotations

from typing import Any

import pytest

from workflow_engine.capabilities.tasks._orchestrator import task_from_orchestrator
from workflow_engine.errors import TaskNotStartable

TASK = "33333333-3333-4333-8333-333333333333"


def row(**columns: Any) -> dict[str, Any]:
    """A row as their ORM leaves it: every column present, most of them null."""
    return {
        "id": TASK,
        "created_by": None,
        "project_id": None,
        "status": "pending",
        "closed": False,
        "prompt": "$ echo hello",
        "acceptance_criteria": None,
        "summary": None,
        "metadata": None,
        **columns,
    }


def load(**columns: Any) -> Any:
    return task_from_orchestrator(TASK, row(**columns), source="the test")


@pytest.mark.parametrize(
    ("criteria", "descriptions"),
    [
        (None, []),
        ([], []),
        (["builds", "passes"], ["builds", "passes"]),
        (
            [{"description": "says hi", "check": {"kind": "stdout_contains", "value": "hi"}}],
            ["says hi"],
        ),
        (["plain", {"description": "checked"}], ["plain", "checked"]),
    ],
)
def test_acceptance_criteria_are_strings_or_the_engines_objects(
    criteria: Any, descriptions: list[str]
) -> None:
    task = load(acceptance_criteria=criteria)
    assert [c.description for c in task.acceptance_criteria] == descriptions


def test_a_criterion_check_is_kept() -> None:
    task = load(acceptance_criteria=[{"check": {"kind": "stdout_contains", "value": "hi"}}])
    check = task.acceptance_criteria[0].check
    assert check is not None and (check.kind, check.value) == ("stdout_contains", "hi")


@pytest.mark.parametrize(
    ("criteria", "named"),
    [
        ("just text", "task.acceptance_criteria: must be a list"),
        ([42], "task.acceptance_criteria[0]: must be a JSON object"),
        ([{"check": {"kind": "telepathy"}}], "task.acceptance_criteria[0].check.kind"),
    ],
)
def test_unreadable_criteria_make_the_task_unstartable_naming_the_field(
    criteria: Any, named: str
) -> None:
    with pytest.raises(TaskNotStartable, match=named.replace("[", r"\[").replace("]", r"\]")):
        load(acceptance_criteria=criteria)


def test_metadata_maps_the_owner_project_name_and_string_labels() -> None:
    task = load(
        created_by="u-1",
        project_id="p-1",
        summary="Greeting",
        metadata={"team": "core", "priority": 3, "tags": ["a"], "steps": [{"id": "x"}]},
    )
    assert task.metadata.user_id == "u-1"
    assert task.metadata.project_id == "p-1"
    assert task.metadata.labels == {"team": "core", "name": "Greeting"}
    assert task.steps == ()  # metadata's `steps` is theirs, not the engine's


def test_metadata_that_is_not_an_object_is_ignored() -> None:
    assert load(metadata=["not", "an", "object"]).metadata.labels == {}


def test_a_null_prompt_is_empty_and_preferences_are_one_layer() -> None:
    task = task_from_orchestrator(
        TASK, row(prompt=None), source="the test", preferences={"style": {"tone": "brief"}}
    )
    assert task.prompt == ""
    assert task.preferences == ({"style": {"tone": "brief"}},)


@pytest.mark.parametrize(
    ("columns", "why"),
    [
        ({"closed": True}, "it is closed"),
        ({"deleted_at": "2026-01-01T00:00:00+00:00"}, "it was deleted"),
        ({"status": "completed"}, "its status is 'completed'"),
        ({"status": "Canceled"}, "its status is 'Canceled'"),
        ({"status": "superseded"}, "its status is 'superseded'"),
    ],
)
def test_a_closed_deleted_or_finished_task_is_not_startable(
    columns: dict[str, Any], why: str
) -> None:
    with pytest.raises(TaskNotStartable, match=why):
        load(**columns)


@pytest.mark.parametrize("status", ["pending", "running", "failed", None, "planning"])
def test_other_statuses_are_startable(status: Any) -> None:
    assert load(status=status, deleted_at=None).prompt == "$ echo hello"
