"""The embedded planner: the task's own steps, or the `$ command` lines of its prompt.

It works offline and deterministically, so a task planned twice (after a restart) gets the same
plan. An LLM planner implements the same `Planner` protocol.
"""

from __future__ import annotations

import shlex

import structlog

from workflow_engine.domain.task import MAX_STEPS, Plan, Step, TaskSpec
from workflow_engine.domain.values import parse
from workflow_engine.errors import InvalidArgument

log = structlog.get_logger(__name__)

_COMMAND_PREFIX = "$ "
# Skipped prompt lines named in a refusal, at most; the message stays a few hundred characters.
_SKIPPED_NAMED = 3


class StaticPlanner:
    """Plans without a model: given steps win; otherwise each `$ cmd` prompt line is a step."""

    async def plan(self, task: TaskSpec) -> Plan:
        """The plan; empty when nothing can be derived, `InvalidArgument` when it cannot run."""
        plan = derive_plan(task)
        if not task.steps:
            log.info("plan_derived", steps=len(plan.steps), skipped=len(plan.assumptions) - 1)
        return plan

    def check(self, task: TaskSpec) -> None:
        """Refuse a task whose plan would be empty or could not run: the plan is all it takes."""
        try:
            plan = derive_plan(task)
        except InvalidArgument as exc:  # given steps are valid: these came from the prompt
            raise InvalidArgument(
                "task.prompt", f"its '$ command' lines plan steps that cannot run: {exc.message}"
            ) from None
        if not plan.steps:
            skipped = [note for note in plan.assumptions if note.startswith("skipped")]
            more = len(skipped) - _SKIPPED_NAMED
            raise InvalidArgument(
                "task.steps",
                "required: the task has no steps and its prompt has no usable '$ command' lines"
                + "".join(f"; {note}" for note in skipped[:_SKIPPED_NAMED])
                + (f"; and {more} more skipped line(s)" if more > 0 else ""),
            )


def derive_plan(task: TaskSpec) -> Plan:
    """The task's plan: its own steps, or one step per usable `$ command` prompt line.

    Raises `InvalidArgument` (naming ``plan.steps[i]``) when a line makes a step that cannot run.
    """
    if task.steps:
        return Plan(steps=task.steps, assumptions=("steps given by the task",))
    lines = task.prompt.splitlines()
    # Counted before any is split: splitting costs some 2 us a character, on the event loop.
    commands = sum(1 for line in lines if line.strip().startswith(_COMMAND_PREFIX))
    if commands > MAX_STEPS:
        raise InvalidArgument(
            "plan.steps", f"more than {MAX_STEPS} steps ({commands} '$ command' lines)"
        )
    steps: list[Step] = []
    assumptions: list[str] = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text.startswith(_COMMAND_PREFIX):
            continue
        try:
            argv = shlex.split(text[len(_COMMAND_PREFIX) :])
        except ValueError as exc:
            assumptions.append(f"skipped prompt line {number} ({exc}): {text[:200]}")
            continue
        if not argv or not argv[0]:
            assumptions.append(f"skipped prompt line {number} (no program): {text[:200]}")
            continue
        step = {"id": f"step-{len(steps) + 1}", "command": argv, "description": text}
        steps.append(parse(Step, step, f"plan.steps[{len(steps)}]"))
    if steps:
        assumptions.insert(0, f"steps derived from {len(steps)} '$ command' line(s) of the prompt")
    else:
        assumptions.append(
            "the task gave no steps and its prompt has no usable '$ command' lines, "
            "so there is nothing to run"
        )
    plan: Plan = parse(Plan, {"steps": steps, "assumptions": assumptions}, "plan")
    return plan
