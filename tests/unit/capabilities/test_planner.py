"""The static planner keeps given steps, or derives them from `$ command` prompt lines."""

from __future__ import annotations

import time

import pytest

from workflow_engine.capabilities._static_planner import StaticPlanner
from workflow_engine.domain import Step, TaskSpec
from workflow_engine.errors import InvalidArgument


async def test_given_steps_are_the_plan() -> None:
    steps = (Step(id="build", command=("make",)), Step(id="test", command=("make", "test")))
    plan = await StaticPlanner().plan(TaskSpec(prompt="$ ignored", steps=steps))
    assert plan.steps == steps
    assert plan.assumptions == ("steps given by the task",)


async def test_steps_are_derived_from_dollar_lines() -> None:
    prompt = "\n".join(
        [
            "Please do the following:",
            "$ echo 'hello world'",
            "   $ ls -l /tmp   ",
            "$echo not a command",
            "and some prose with $ in it",
        ]
    )
    plan = await StaticPlanner().plan(TaskSpec(prompt=prompt))
    assert [s.id for s in plan.steps] == ["step-1", "step-2"]
    assert plan.steps[0].command == ("echo", "hello world")
    assert plan.steps[0].description == "$ echo 'hello world'"
    assert plan.steps[1].command == ("ls", "-l", "/tmp")
    assert len(plan.assumptions) == 1
    assert "2" in plan.assumptions[0]


async def test_unbalanced_quotes_are_skipped_with_an_assumption() -> None:
    prompt = "$ echo 'oops\n$ true"
    plan = await StaticPlanner().plan(TaskSpec(prompt=prompt))
    assert [s.command for s in plan.steps] == [("true",)]
    assert plan.steps[0].id == "step-1"
    skipped = [a for a in plan.assumptions if "skipped" in a]
    assert len(skipped) == 1
    assert "line 1" in skipped[0]


async def test_an_empty_command_is_skipped() -> None:
    plan = await StaticPlanner().plan(TaskSpec(prompt="$ ''\n$ true"))
    assert [s.command for s in plan.steps] == [("true",)]


async def test_nothing_to_derive_is_an_empty_plan_not_an_error() -> None:
    plan = await StaticPlanner().plan(TaskSpec(prompt="just prose\n$ 'unbalanced"))
    assert plan.steps == ()
    assert any("no usable '$ command' lines" in a for a in plan.assumptions)


async def test_planning_is_deterministic() -> None:
    task = TaskSpec(prompt="$ a\n$ b c")
    assert await StaticPlanner().plan(task) == await StaticPlanner().plan(task)


def test_check_accepts_what_plan_can_plan() -> None:
    planner = StaticPlanner()
    planner.check(TaskSpec(steps=(Step(id="a", command=("true",)),)))
    planner.check(TaskSpec(prompt="prose first\n$ make check"))


@pytest.mark.parametrize(
    "prompt", ["", "just prose", "$ 'unbalanced", "$ ''", "$echo no space after the dollar"]
)
def test_check_refuses_a_task_with_nothing_to_plan(prompt: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        StaticPlanner().check(TaskSpec(prompt=prompt))
    assert err.value.field == "task.steps"
    assert err.value.message.startswith("task.steps: required")
    assert "'$ command' lines" in err.value.message


@pytest.mark.parametrize(
    ("prompt", "problem"),
    [
        ("$ echo" + " a" * 300, "more than 256 arguments"),
        ("$ true\n" * 501, "more than 500 steps"),
    ],
)
def test_check_refuses_command_lines_that_plan_steps_that_cannot_run(
    prompt: str, problem: str
) -> None:
    with pytest.raises(InvalidArgument) as err:
        StaticPlanner().check(TaskSpec(prompt=prompt))
    assert err.value.field == "task.prompt"
    assert problem in err.value.message


@pytest.mark.timing
def test_command_lines_are_counted_before_any_is_split() -> None:
    """A prompt (at most 64 KiB) of 16,383 '$ x' lines: splitting each and refusing the 501st
    step took 0.52 s of the event loop, at start and again in plan_steps."""
    started = time.perf_counter()
    with pytest.raises(InvalidArgument) as err:
        StaticPlanner().check(TaskSpec(prompt="$ x\n" * 16_383))
    took = time.perf_counter() - started
    assert "more than 500 steps (16383 '$ command' lines)" in err.value.message
    assert took < 0.05, took
