"""Task validation names the field at fault; JSON round trips keep every field."""

from __future__ import annotations

import pytest

from workflow_engine.errors import InvalidArgument
from workflow_engine.graph.nodes import job_id_for
from workflow_engine.spec import (
    AcceptanceCriterion,
    Check,
    Step,
    TaskMetadata,
    TaskSpec,
    validate_task,
)


def test_round_trip_keeps_everything() -> None:
    spec = TaskSpec(
        prompt="p",
        acceptance_criteria=(AcceptanceCriterion("c", Check("exit_code", equals=0)),),
        steps=(
            Step(
                id="a",
                command=("echo", "x"),
                env={"K": "v"},
                timeout_seconds=5,
                expect=(Check("json_field_equals", field="a.b", equals=[1, "x"]),),
            ),
            Step(id="b", command=("true",), depends_on=("a",), requires_approval=True),
        ),
        preferences=({"style": {"tabs": False}},),
        metadata=TaskMetadata(user_id="u", project_id="p", labels={"l": "1"}),
        max_attempts_per_step=4,
    )
    assert TaskSpec.from_json(spec.to_json()) == spec
    validate_task(spec)


def test_cycle_is_reported_with_its_path() -> None:
    steps = (
        Step(id="a", command=("true",), depends_on=("c",)),
        Step(id="b", command=("true",), depends_on=("a",)),
        Step(id="c", command=("true",), depends_on=("b",)),
    )
    with pytest.raises(InvalidArgument) as err:
        validate_task(TaskSpec(steps=steps))
    assert err.value.field == "task.steps.depends_on"
    assert "a -> c -> b -> a" in err.value.problem


def test_too_deep_preferences_are_refused() -> None:
    deep: dict[str, object] = {}
    node = deep
    for _ in range(40):
        node["x"] = {}
        node = node["x"]  # type: ignore[assignment]
    with pytest.raises(InvalidArgument) as err:
        validate_task(TaskSpec(preferences=(deep,)))
    assert err.value.field == "task.preferences[0]"


@pytest.mark.parametrize("equals", [float("inf"), float("nan"), 1.5, True, "0", 1e300, 256])
def test_exit_code_check_needs_a_small_whole_number(equals: object) -> None:
    step = Step(id="a", command=("true",), expect=(Check("exit_code", equals=equals),))
    with pytest.raises(InvalidArgument) as err:
        validate_task(TaskSpec(steps=(step,)))
    assert err.value.field == "task.steps[0].expect[0].equals"


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_numbers_are_refused_where_json_is_stored(bad: float) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_task(TaskSpec(preferences=({"a": [1, {"b": bad}]},)))
    assert err.value.field == "task.preferences[0]"
    step = Step(
        id="a", command=("true",), expect=(Check("json_field_equals", field="x", equals=bad),)
    )
    with pytest.raises(InvalidArgument) as err:
        validate_task(TaskSpec(steps=(step,)))
    assert err.value.field == "task.steps[0].expect[0].equals"


def test_job_ids_are_deterministic_per_task_step_and_attempt() -> None:
    a = job_id_for("t", "s", 1)
    assert a == job_id_for("t", "s", 1)
    assert len({a, job_id_for("t", "s", 2), job_id_for("t", "s2", 1), job_id_for("u", "s", 1)}) == 4
