"""The domain model: validation names the field at fault; JSON round trips keep every field."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from workflow_engine.domain import JobRequest, JobResult, Sandbox, Verification, parse
from workflow_engine.domain.task import (
    STEPS,
    AcceptanceCriterion,
    Check,
    Plan,
    Step,
    TaskMetadata,
    TaskSpec,
)
from workflow_engine.errors import InvalidArgument
from workflow_engine.graph._nodes import JOB_NAMESPACE, job_id_for


def refused(data: dict[str, Any]) -> InvalidArgument:
    """The error a task built from `data` is refused with (it must be refused)."""
    with pytest.raises(InvalidArgument) as err:
        parse(TaskSpec, data, "task")
    return err.value


def test_round_trip_keeps_everything() -> None:
    spec = TaskSpec(
        prompt="p",
        acceptance_criteria=(
            AcceptanceCriterion(description="c", check=Check(kind="exit_code", equals=0)),
        ),
        steps=(
            Step(
                id="a",
                command=("echo", "x"),
                env={"K": "v"},
                timeout_seconds=5,
                expect=(Check(kind="json_field_equals", field="a.b", equals=[1, "x"]),),
            ),
            Step(
                id="b",
                command=("true",),
                depends_on=("a",),
                requires_approval=True,
                approval_timeout_seconds=30,
                on_approval_timeout="suspend",
            ),
        ),
        preferences=({"style": {"tabs": False}},),
        metadata=TaskMetadata(user_id="u", project_id="p", labels={"l": "1"}),
        max_attempts_per_step=4,
        approval_timeout_seconds=3600,
        on_approval_timeout="reject",
    )
    assert TaskSpec.from_json(spec.to_json()) == spec
    assert parse(TaskSpec, spec.to_json(), "task") == spec


NO_LIMITS = dict.fromkeys(("cpu_seconds", "memory_mb", "open_files", "processes", "output_mb"), 0)


def test_the_stored_json_keeps_its_shape() -> None:
    """The keys rows written before the domain model hold; a resumed workflow reads them."""
    step = Step(id="a", command=("true",))
    assert step.to_json() == {
        "id": "a",
        "description": "",
        "command": ["true"],
        "env": {},
        "timeout_seconds": 0,
        "depends_on": [],
        "requires_approval": False,
        "expect": [],
        "image": "",
        "required_labels": [],
        "secret_env": [],
        "limits": NO_LIMITS,
        # Issue 52; older rows lack them and read as "the task's default".
        "approval_timeout_seconds": 0,
        "on_approval_timeout": None,
    }
    assert Step.from_json({k: v for k, v in step.to_json().items() if "approval_t" not in k}) == (
        step
    )
    job = JobRequest(task_id="t", job_id="j", sandbox=Sandbox(command=("true",)))
    assert job.to_json() == {
        "version": 1,
        "task_id": "t",
        "job_id": "j",
        "sandbox": {
            "image": "",
            "command": ["true"],
            "env": {},
            "timeout_seconds": 0,
            "network_policy": "restricted",
            "limits": NO_LIMITS,
        },
        "attempt": 1,
        "step_id": "",
        "remediation": [],
        "context": [],
        "required_labels": [],
        "preferred_labels": [],
        "run_id": "",  # state format 4; older rows lack it and read as "the task's run"
    }
    assert JobRequest.from_json({k: v for k, v in job.to_json().items() if k != "run_id"}) == job
    result = JobResult(task_id="t", job_id="j", status="completed", exit_code=0)
    assert set(result.to_json()) == {
        "version", "task_id", "job_id", "status", "exit_code", "stdout", "stderr",
        "started_at", "ended_at", "truncated", "work_dir", "target", "artifacts",
    }  # fmt: skip
    assert result.to_json()["truncated"] == {"stdout": False, "stderr": False}


def test_cycle_is_reported_with_its_path() -> None:
    steps = [
        {"id": "a", "command": ["true"], "depends_on": ["c"]},
        {"id": "b", "command": ["true"], "depends_on": ["a"]},
        {"id": "c", "command": ["true"], "depends_on": ["b"]},
    ]
    err = refused({"steps": steps})
    assert err.field == "task.steps.depends_on"
    assert "a -> c -> b -> a" in err.problem


def test_too_deep_preferences_are_refused() -> None:
    deep: dict[str, object] = {}
    node = deep
    for _ in range(40):
        node["x"] = {}
        node = node["x"]  # type: ignore[assignment]
    assert refused({"preferences": [deep]}).field == "task.preferences[0]"


@pytest.mark.parametrize("equals", [float("inf"), float("nan"), 1.5, True, "0", 1e300, 256])
def test_exit_code_check_needs_a_small_whole_number(equals: object) -> None:
    step = {"id": "a", "command": ["true"], "expect": [{"kind": "exit_code", "equals": equals}]}
    assert refused({"steps": [step]}).field == "task.steps[0].expect[0].equals"


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_non_finite_numbers_are_refused_where_json_is_stored(bad: float) -> None:
    assert refused({"preferences": [{"a": [1, {"b": bad}]}]}).field == "task.preferences[0]"
    check = {"kind": "json_field_equals", "field": "x", "equals": bad}
    step = {"id": "a", "command": ["true"], "expect": [check]}
    assert refused({"steps": [step]}).field == "task.steps[0].expect[0].equals"


def one(**fields: Any) -> dict[str, Any]:
    """A task of one step `a` running `echo`, with `fields` changed."""
    return {"steps": [{"id": "a", "command": ["echo"], **fields}]}


def checked(**check: Any) -> dict[str, Any]:
    return one(expect=[check])


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"prompt": "x\x00y"}, "task.prompt"),
        ({"prompt": "x" * 70_000}, "task.prompt"),
        (one(command=[]), "task.steps[0].command"),
        (one(command=["", "x"]), "task.steps[0].command[0]"),
        (one(command=["echo", "\x00"]), "task.steps[0].command[1]"),
        (one(description="\x00"), "task.steps[0].description"),
        (one(env={"A": "\x00"}), "task.steps[0].env[A]"),
        (one(env={"1A": "x"}), "task.steps[0].env"),
        (one(timeout_seconds=-1), "task.steps[0].timeout_seconds"),
        (one(timeout_seconds="soon"), "task.steps[0].timeout_seconds"),
        ({"steps": one()["steps"] * 2}, "task.steps[1].id"),
        ({"steps": one()["steps"] * 501}, "task.steps"),
        (one(depends_on=["a"]), "task.steps[0].depends_on[0]"),
        (checked(kind="nope"), "task.steps[0].expect[0].kind"),
        (checked(kind="stdout_matches", value="("), "task.steps[0].expect[0].value"),
        (checked(kind="json_field_equals"), "task.steps[0].expect[0].field"),
        ({"preferences": [{"k\x00": 1}]}, "task.preferences[0]"),
        ({"metadata": {"user_id": "\x00"}}, "task.metadata.user_id"),
        (
            {"acceptance_criteria": [{"description": "c", "check": {"kind": "file_exists"}}]},
            "task.acceptance_criteria[0].check.value",
        ),
        ({"budget": {"max_dispatches": -1}}, "task.budget.max_dispatches"),
        ({"max_attempts_per_step": 0}, "task.max_attempts_per_step"),
        ({"max_parallel_steps": 65}, "task.max_parallel_steps"),
    ],
)
def test_each_invariant_names_its_field(data: dict[str, Any], field: str) -> None:
    assert refused(data).field == field


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (one(command="echo hi"), "task.steps[0].command: must be a list"),
        ({"steps": [{"command": ["x"]}]}, "task.steps[0].id: required"),
        (one(timeout_seconds=1.5), "task.steps[0].timeout_seconds: must be a whole number"),
        (one(requires_approval="maybe"), "task.steps[0].requires_approval: must be true or false"),
        ({"metadata": []}, "task.metadata: must be a JSON object"),
    ],
)
def test_type_errors_are_worded_for_json_clients(data: dict[str, Any], message: str) -> None:
    assert refused(data).message == message


def test_a_bare_list_of_steps_is_named_from_where_it_came() -> None:
    """An edited plan (a decision, a set_state) names the field the client sent."""
    steps = [{"id": "a", "command": ["true"]}, {"id": "b", "command": ["\x00"]}]
    with pytest.raises(InvalidArgument, match=r"^decision\[1\]\.command\[0\]: "):
        parse(STEPS, steps, "decision")


@pytest.mark.parametrize(
    ("check", "problem"),
    [
        ({"kind": "stdout_matches", "value": r"(a)\1"}, "RE2 refuses it: invalid escape"),
        ({"kind": "stdout_matches", "value": "a(?=b)"}, "RE2 refuses it: invalid perl operator"),
        ({"kind": "stdout_matches", "value": "(a|b)*a(a|b){700}c"}, "RE2 instructions"),
        ({"kind": "stdout_matches", "value": "x" * 2000}, "longer than 1024 characters"),
        ({"kind": "stdout_matches", "value": r"\pL\pN\pL\pN\pL"}, "more than 4 Unicode classes"),
        ({"kind": "stdout_matches", "value": "a{1000}b{1000}c{1}"}, "add up to 2001"),
        ({"kind": "stdout_matches", "value": "x" * 40_000}, "longer than 32768 characters"),
        ({"kind": "file_exists", "value": "/etc/shadow"}, "not an absolute one"),
        ({"kind": "file_exists", "value": "out/../../x"}, "may not leave"),
        ({"kind": "json_field_equals", "field": "a." * 20_000, "equals": 1}, "longer than"),
    ],
)
def test_checks_a_tenant_writes_are_bounded_and_stay_in_the_work_dir(
    check: dict[str, Any], problem: str
) -> None:
    error = refused(checked(**check))
    field = "field" if check["kind"] == "json_field_equals" else "value"
    assert error.field == f"task.steps[0].expect[0].{field}"
    assert problem in error.message


def patterns(*values: str) -> list[dict[str, str]]:
    return [{"kind": "stdout_matches", "value": value} for value in values]


@pytest.mark.parametrize(
    ("data", "field", "problem"),
    [
        (one(expect=patterns(*(f"p{i}" for i in range(65)))), "task.steps", "more than 64"),
        (
            {
                "steps": [
                    {"id": f"s{i}", "command": ["x"], "expect": patterns(f"{i}" + "." * 1000)}
                    for i in range(5)
                ]
            },
            "task.steps",
            "5005 characters in all",
        ),
        (
            {
                "acceptance_criteria": [
                    {"check": c} for c in patterns(*(f"{i}\\pL" * 4 for i in range(5)))
                ]
            },
            "task.acceptance_criteria",
            "20 Unicode classes",
        ),
    ],
)
def test_the_patterns_of_a_plan_are_bounded_together(
    data: dict[str, Any], field: str, problem: str
) -> None:
    """Refused before any is compiled: each costs up to milliseconds, on the request's loop."""
    error = refused(data)
    assert error.field == field
    assert problem in error.message


def test_checks_an_older_engine_stored_still_read() -> None:
    """Stored under the rules it was written with: the verifier judges it (a failed finding)."""
    stored = [
        {"kind": "stdout_matches", "value": r"(a)\1"},
        {"kind": "file_exists", "value": "/etc/shadow"},
        {"kind": "file_exists", "value": "../x"},
    ]
    step = Step.from_json({"id": "s", "command": ["true"], "expect": stored})
    assert [check.value for check in step.expect] == [c["value"] for c in stored]
    with pytest.raises(InvalidArgument):  # as input, each is refused
        parse(STEPS, [step.to_json()], "decision")


def test_invalid_values_cannot_be_built() -> None:
    with pytest.raises(ValueError, match="argv must not be empty"):
        Step(id="a", command=())
    with pytest.raises(ValueError, match="duplicate step id"):
        Plan(steps=(Step(id="a", command=("x",)), Step(id="a", command=("y",))))


def test_plan_and_verification_export_json_schemas() -> None:
    """What an LLM planner and verifier are asked to answer with."""
    plan = Plan.model_json_schema()
    step = plan["$defs"]["Step"]
    assert plan["required"] == ["steps"]
    assert plan["properties"]["steps"]["maxItems"] == 500
    assert step["required"] == ["id", "command"]
    assert step["properties"]["id"]["pattern"].startswith("^[A-Za-z0-9]")
    assert step["properties"]["command"]["maxItems"] == 256
    assert "exit_code" in plan["$defs"]["Check"]["properties"]["kind"]["enum"]
    verification = Verification.model_json_schema()
    assert verification["properties"]["status"]["enum"] == ["pass", "fail"]
    assert verification["$defs"]["Finding"]["required"] == ["check", "passed", "detail"]


def test_job_ids_are_deterministic_per_task_run_step_and_attempt() -> None:
    a = job_id_for("t", "s", 1, "r")
    assert a == job_id_for("t", "s", 1, "r")
    others = {
        job_id_for("t", "s", 2, "r"),
        job_id_for("t", "s2", 1, "r"),
        job_id_for("u", "s", 1, "r"),
        job_id_for("t", "s", 1, "r2"),
        job_id_for("t", "s", 1),  # a run with no id (before state format 4): the task's
    }
    assert len({a, *others}) == 6
    # A run with no id keeps the ids engines before format 4 gave its jobs.
    assert job_id_for("t", "s", 1) == str(uuid.uuid5(JOB_NAMESPACE, "t/s/1"))


def test_secret_env_must_name_env_variables() -> None:
    step = {"id": "a", "command": ["true"], "env": {"TOKEN": "x"}, "secret_env": ["TOKEN", "KEY"]}
    error = refused({"steps": [step]})
    assert error.field == "task.steps[0].secret_env[1]" and "'KEY'" in error.message
    ok = parse(TaskSpec, {"steps": [{**step, "secret_env": ["TOKEN"]}]}, "task")
    assert ok.steps[0].secret_env == ("TOKEN",)


#: Each list of a task one past its limit, its elements all invalid: the count is what refuses
#: it, before a single element is validated (a request's lists are counted on the message before
#: it is converted, `api._limits`; a set_state plan or a model's plan arrives as JSON).
OVER_THE_LIMIT = [
    ({"steps": [{}] * 501}, "task.steps", "more than 500 steps"),
    ({"acceptance_criteria": [7] * 65}, "task.acceptance_criteria", "more than 64 acceptance"),
    ({"preferences": [7] * 33}, "task.preferences", "more than 32 preference layers"),
    (
        {"metadata": {"labels": {str(i): 7 for i in range(65)}}},
        "task.metadata.labels",
        "more than 64 labels",
    ),
    (one(depends_on=[7] * 501), "task.steps[0].depends_on", "more than 500 dependencies"),
    (one(secret_env=[7] * 257), "task.steps[0].secret_env", "more than 256 secret variables"),
    (one(expect=[7] * 65), "task.steps[0].expect", "more than 64 checks"),
]


@pytest.mark.parametrize(("data", "field", "problem"), OVER_THE_LIMIT, ids=lambda v: str(v)[:30])
def test_a_list_is_counted_before_its_elements_are_validated(
    data: dict[str, Any], field: str, problem: str
) -> None:
    error = refused(data)
    assert error.field == field
    assert problem in error.message


def test_lists_an_older_engine_stored_past_a_newer_limit_still_read() -> None:
    """Limits added since (criteria, preferences, labels, dependencies, secrets) hold for input;
    a task stored before them still reads."""
    stored = {
        "acceptance_criteria": [{"description": "c"}] * 65,
        "preferences": [{}] * 33,
        "metadata": {"labels": {str(i): "" for i in range(65)}},
        "steps": [
            {"id": "a", "command": ["true"], "env": {"K": "v"}, "secret_env": ["K"] * 257},
            {"id": "b", "command": ["true"], "depends_on": ["a"] * 501},
        ],
    }
    task = TaskSpec.from_json(stored)
    assert len(task.acceptance_criteria) == 65 and len(task.steps[1].depends_on) == 501
