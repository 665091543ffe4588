"""The ``llm`` planner: a model turns a task's prompt and criteria into executable steps.

The model is told the task, its acceptance criteria, the effective preferences and what the
workers can run, and answers with a plan in the schema a model writes (`answer_schemas`: only
what a model may set; nothing else of its answer is kept). The answer is checked by the domain
model and against what the worker can run (`Worker.unfit`: the local sandbox has no labels),
and an invalid one is asked for again with what was wrong (see `answer_valid`). A task that
gives its own steps is not sent to the model: the caller planned it. Every
model-planned step then goes through the command policy, its program and its env: allowed,
waiting for approval (`requires_approval`), or refused (`PlanRefused`, the workflow fails with
the rule).

The policy's decision on each step is a value (`_command_policy.PolicyDecision`), returned with the
plan (`PolicedPlan.policy`) or the revised step, for the workflow to record; the plan's
assumptions and a revision's record say it in words too (`policy_note`), for people.

`revise` rewrites one step from its failed verification, for the step's next attempt; its answer
is checked the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from pydantic import Field

from workflow_engine._masking import MASK, Secrets, for_workflow, step_secrets
from workflow_engine.capabilities._protocols import Unfit, check_step, check_steps
from workflow_engine.capabilities._static_planner import derive_plan
from workflow_engine.capabilities.model._client import ModelClient, answer_valid
from workflow_engine.capabilities.model._command_policy import CommandPolicy, PolicyDecision
from workflow_engine.capabilities.model.answer_schemas import plan_schema, step_schema, trimmed
from workflow_engine.capabilities.tasks import merge_preferences
from workflow_engine.config import LlmSettings
from workflow_engine.domain.jobs import JobResult, Verification
from workflow_engine.domain.task import Plan, Step, TaskSpec
from workflow_engine.domain.values import JsonObject, parse
from workflow_engine.errors import InvalidArgument, PlanRefused

log = structlog.get_logger(__name__)

PLAN_SYSTEM = """\
You are the planner of a workflow engine (the Project Manager Agent). Turn the task into \
steps a worker executes. Each step's `command` is an argv list executed directly, never \
through a shell unless you name one (["sh", "-c", "..."]); each step runs in a fresh, empty \
work directory, so pass files between steps through absolute paths. Give each step the machine \
checks (`expect`) that prove it worked whenever you can state them (kinds: exit_code with \
`equals`, stdout_contains / stderr_contains with `value`, stdout_matches with an RE2 pattern \
as `value` (no backreferences or lookaround), file_exists with a `value` relative to the work \
directory (no absolute path, no `..`), json_field_equals with `field` and `equals`). Steps run \
in order unless a step names `depends_on`. Put what you assumed in `assumptions`. Answer with \
JSON only, following the schema."""

#: The plan's instructions for a small model (``WORKFLOW_ENGINE_LLM_PROFILE=small``): fewer
#: words, and an example answer to copy the shape of.
PLAN_SYSTEM_SMALL = """\
You turn a task into commands. Answer with JSON only, like this example: \
{"steps": [{"id": "write", "command": ["sh", "-c", "echo hi > /tmp/note.txt"], "expect": \
[{"kind": "exit_code", "equals": 0}]}, {"id": "show", "command": ["cat", "/tmp/note.txt"], \
"expect": [{"kind": "stdout_contains", "value": "hi"}]}]}. Each command is an argv list; use \
["sh", "-c", "..."] for shell syntax. Steps run in order. Keep files in /tmp."""

REVISE_SYSTEM = """\
You are the planner of a workflow engine. A step of your plan failed its verification. Answer \
with the whole step, revised so that its next attempt passes: same `id`, a corrected \
`command` (an argv list) and checks. Answer with JSON only, following the schema."""


class PolicedPlan(Plan):
    """A model's plan as the command policy lets it run, with the policy's decision on each of
    its steps by id. The decisions are not part of the plan's JSON (`exclude`): the workflow
    records what it needs of them with each step's state."""

    policy: dict[str, PolicyDecision] = Field(default_factory=dict, exclude=True)


def policy_note(step_id: str, decision: PolicyDecision) -> str:
    """The policy's decision on a step in words, as the plan's assumptions and a revision's
    record show it."""
    verb = "runs" if decision.verdict == "allow" else "waits for approval"
    return f"command policy: step {step_id} {verb} ({decision.reason})"


class LlmPlanner:
    """Plans prompt-only tasks with a model; keeps the steps a task gives."""

    def __init__(
        self,
        client: ModelClient,
        settings: LlmSettings,
        policy: CommandPolicy,
        workers: Callable[[], str],
        unfit: Unfit,
    ) -> None:
        self.client = client
        self._settings = settings
        self._policy = policy
        #: What the workers can run, asked at each plan (worker nodes come and go).
        self._workers = workers
        #: Why the worker can never run a step (`Worker.unfit`): a planned step it names is
        #: asked for again, like any invalid answer.
        self._unfit = unfit
        profile = settings.answer_profile()
        #: What a model may write: a plan, or one step (a revision).
        self._plan_schema = plan_schema(profile)
        self._step_schema = step_schema(profile)
        self._system = PLAN_SYSTEM_SMALL if profile == "small" else PLAN_SYSTEM

    def check(self, task: TaskSpec) -> None:
        """A task with neither steps nor a prompt gives the model nothing to plan."""
        if not task.steps and not task.prompt.strip():
            raise InvalidArgument(
                "task.prompt", "required: the task has no steps, and no prompt to plan from"
            )

    async def plan(self, task: TaskSpec) -> Plan:
        if task.steps:
            return derive_plan(task)
        messages = [
            {"role": "system", "content": self._system},
            {"role": "user", "content": json.dumps(self._task_brief(task), indent=1)},
        ]
        plan: Plan = await answer_valid(
            self.client,
            "plan",
            messages,
            "plan",
            self._plan_schema,
            self._valid_plan,
            self._settings.plan_attempts,
        )
        return self.contained(plan)

    def _valid_plan(self, answer: Any) -> Plan:
        plan: Plan = parse(Plan, trimmed(answer, self._plan_schema), "plan")
        if not plan.steps:
            raise InvalidArgument("plan.steps", "required: at least one step")
        check_steps(self._unfit, plan.steps, "plan.steps")
        return plan

    def contained(self, plan: Plan) -> PolicedPlan:
        """`plan` with the command policy applied: steps it wants approved marked so, and
        `PlanRefused` for a step whose command it denies."""
        steps: list[Step] = []
        decisions: dict[str, PolicyDecision] = {}
        for step in plan.steps:
            checked, decisions[step.id] = self.contain(step)
            steps.append(checked)
        notes = [policy_note(sid, decision) for sid, decision in decisions.items()]
        return PolicedPlan(
            steps=tuple(steps), assumptions=(*plan.assumptions, *notes), policy=decisions
        )

    def contain(self, step: Step) -> tuple[Step, PolicyDecision]:
        """The step as the policy lets it run, and what the policy decided."""
        decision = self._policy.decide(step.command, step.env)
        shown = json.dumps(list(step.command))[:300]
        if decision.verdict == "deny":
            raise PlanRefused(
                f"step {step.id}: the model planned the command {shown}, which the command "
                f"policy denies ({decision.reason})"
            )
        if decision.verdict == "approve" and not step.requires_approval:
            step = step.model_copy(update={"requires_approval": True})
        return step, decision

    async def revise(
        self, task: TaskSpec, step: Step, result: JobResult, verification: Verification
    ) -> tuple[Step, PolicyDecision]:
        """A revised `step` for its next attempt, and what the policy decided about it.

        The result and the verdict reach the model with the task's secrets (and the engine's
        credentials) masked, and no other workflow's (`secrets.for_workflow`)."""
        masking = for_workflow(self.client.secrets, step_secrets([*task.steps, step]))
        brief = {
            "task": self._task_brief(task),
            "step": shown_to_model(step),
            "result": excerpt(result, self._settings.excerpt_chars, masking),
            "verification": masking.redact_json(verification.to_json()),
        }
        messages = [
            {"role": "system", "content": REVISE_SYSTEM},
            {"role": "user", "content": json.dumps(brief, indent=1)},
        ]

        def valid_step(answer: Any) -> Step:
            revised = self._revised(step, answer)
            check_step(self._unfit, revised, "step")
            return revised

        revised: Step = await answer_valid(
            self.client,
            "revise",
            messages,
            "step",
            self._step_schema,
            valid_step,
            self._settings.plan_attempts,
        )
        return self.contain(revised)

    def _revised(self, step: Step, answer: Any) -> Step:
        """`step` with what the model's answer may change (the properties its step schema
        offers) changed: the rest (`requires_approval`, `secret_env`, `limits`, `image`, and
        the secret variables' values) stays the caller's. Same id, same dependencies."""
        offered = trimmed(answer, self._step_schema)
        if not isinstance(offered, dict):
            raise InvalidArgument("step", "must be a JSON object")
        if offered.get("id", step.id) != step.id:
            raise InvalidArgument("step.id", f"must stay {step.id!r}, got {offered['id']!r}")
        merged = {**step.to_json(), **offered, "depends_on": list(step.depends_on)}
        if isinstance(merged.get("env"), dict):
            kept = {name: step.env[name] for name in step.secret_env if name in step.env}
            merged["env"] = {**merged["env"], **kept}
        revised: Step = parse(Step, merged, "step")
        return revised

    def _task_brief(self, task: TaskSpec) -> JsonObject:
        if self._settings.answer_profile() == "small":
            return {
                "task": task.prompt,
                "acceptance_criteria": [c.to_json() for c in task.acceptance_criteria],
            }
        return {
            "prompt": task.prompt,
            "acceptance_criteria": [c.to_json() for c in task.acceptance_criteria],
            "preferences": merge_preferences(task.preferences),
            "workers": self._workers(),
        }


def shown_to_model(step: Step) -> JsonObject:
    """`step` as a model may see it: its `secret_env` variables' values replaced."""
    shown = step.to_json()
    env = dict(step.env)
    for name in step.secret_env:
        if name in env:
            env[name] = MASK
    shown["env"] = env
    return shown


def excerpt(result: JobResult, chars: int, secrets: Secrets) -> JsonObject:
    """What a model is shown of a result: status, exit code, the ends of its streams (the
    engine's `secrets` masked before they are cut)."""
    return {
        "status": result.status,
        "exit_code": result.exit_code,
        "stdout": _tail(result.stdout, chars, secrets),
        "stderr": _tail(result.stderr, chars, secrets),
        "artifacts": [
            {k: a.get(k) for k in ("name", "content_type", "size_bytes")}
            for a in result.artifacts[:20]
        ],
    }


def _tail(text: str, chars: int, secrets: Secrets) -> str:
    part, cut = secrets.redact_part(text, chars, "tail")
    return f"[{len(text) - chars} chars cut]" + part if cut else part


def describe_workers(worker: str, labels: Sequence[str]) -> str:
    """What the planner is told the workers can run."""
    if worker == "nodes":
        shown = ", ".join(labels) or "labels as the orchestrator's nodes report them"
        return (
            "worker nodes over the Worker API (Linux sandboxes); a step may name "
            f"`required_labels` from: {shown}"
        )
    return (
        "a local Linux sandbox: argv run directly with /bin/sh, coreutils and the engine's "
        "Python on PATH; no network guarantees; it has no labels, so leave `required_labels` "
        "empty (a step that requires any is refused)"
    )
