"""The ``llm`` verifier: machine checks first, then a model judges the result.

The model sees the step (its description, command and expected outputs), bounded excerpts of
the result (stdout, stderr, artifacts' names), the acceptance criteria and the preferences, and
answers with a verdict in the schema a judge writes (`answer_schemas.verification_schema`).
The verdict is the stricter of the two: a failed machine check fails the step whatever the
model says, and so does the model's `fail`. The model's findings are kept beside the checks'
(their `check` prefixed ``model:``), so the next attempt's remediation carries both.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from workflow_engine._masking import Secrets, for_workflow, redact_json, step_secrets
from workflow_engine.capabilities._machine_verifier import MachineVerifier
from workflow_engine.capabilities.model._client import ModelClient, answer_valid
from workflow_engine.capabilities.model._planner import excerpt
from workflow_engine.capabilities.model.answer_schemas import trimmed, verification_schema
from workflow_engine.config import LlmSettings
from workflow_engine.domain.jobs import Finding, JobResult, Verification
from workflow_engine.domain.task import AcceptanceCriterion, Step
from workflow_engine.domain.values import JsonObject, parse

VERIFY_SYSTEM = """\
You verify one step of a workflow (you are the Project Manager Agent's judge). Decide from the \
evidence whether the step's result meets its expected outputs, the task's acceptance criteria \
and the preferences. Answer with JSON only, following the schema: `status` pass or fail, one \
finding per thing you checked (`check`, `passed`, `detail` quoting the evidence), and \
`recommended_actions` that would make a failed step pass on its next attempt."""

#: The judge's instructions for a small model (``WORKFLOW_ENGINE_LLM_PROFILE=small``).
VERIFY_SYSTEM_SMALL = """\
Did the step work? Read its command and output. Answer with JSON only, like this example: \
{"status": "pass", "findings": [{"check": "output", "passed": true, "detail": "it printed hi"}]}. \
Use "fail" when the output shows it did not work."""


class LlmVerifier:
    """Machine checks, then the model's judgement; the stricter verdict wins."""

    def __init__(
        self,
        client: ModelClient,
        settings: LlmSettings,
        machine: MachineVerifier | None = None,
    ) -> None:
        self.client = client
        self._settings = settings
        self._machine = machine or MachineVerifier(secrets=client.secrets)
        profile = settings.answer_profile()
        self._schema = verification_schema(profile)
        self._system = VERIFY_SYSTEM_SMALL if profile == "small" else VERIFY_SYSTEM

    async def verify(
        self,
        step: Step,
        result: JobResult,
        criteria: Sequence[AcceptanceCriterion],
        preferences: Mapping[str, Any] | None = None,
        *,
        run_id: str = "",
        secrets: Collection[str] = (),
    ) -> Verification:
        checked, brief = await checked_brief(
            self._machine,
            step,
            result,
            criteria,
            preferences,
            self._settings.excerpt_chars,
            self.client.secrets,
            secrets,
        )
        messages = [
            {"role": "system", "content": self._system},
            {"role": "user", "content": json.dumps(brief, indent=1)},
        ]
        judged: Verification = await answer_valid(
            self.client,
            "verify",
            messages,
            "verification",
            self._schema,
            lambda answer: parse(Verification, trimmed(answer, self._schema), "verification"),
            self._settings.plan_attempts,
        )
        return combine(checked, judged)


async def checked_brief(
    machine: MachineVerifier,
    step: Step,
    result: JobResult,
    criteria: Sequence[AcceptanceCriterion],
    preferences: Mapping[str, Any] | None,
    excerpt_chars: int,
    engine_secrets: Secrets,
    own: Collection[str],
) -> tuple[Verification, JsonObject]:
    """The machine checks' verdict on `result`, and the brief a judge is shown with it (see
    `verification_brief`): the first half of every judging verifier. Both are masked with the
    workflow's secrets `own` (and the step's) and the engine's credentials
    (`secrets.for_workflow`)."""
    checked = await machine.verify(step, result, criteria, secrets=own)
    masking = for_workflow(engine_secrets, {*own, *step_secrets([step])})
    brief = verification_brief(step, result, checked, criteria, preferences, excerpt_chars, masking)
    return checked, brief


def verification_brief(
    step: Step,
    result: JobResult,
    checked: Verification,
    criteria: Sequence[AcceptanceCriterion],
    preferences: Mapping[str, Any] | None,
    excerpt_chars: int,
    secrets: Secrets,
) -> JsonObject:
    """What a judge (the model, or the analyst's job) is shown: the step, bounded excerpts of
    its result, the machine checks' verdict, the criteria and the preferences; every secret
    masked throughout (the step's own, and those of `secrets`), wherever one is: a check's
    value, the command, a finding that quotes the output."""
    brief = {
        "step": {
            "id": step.id,
            "description": step.description,
            "command": list(step.command),
            "expect": [c.to_json() for c in step.expect],
        },
        "result": excerpt(result, excerpt_chars, secrets),
        "machine_checks": checked.to_json(),
        "acceptance_criteria": [c.to_json() for c in criteria],
        "preferences": dict(preferences or {}),
    }
    masked: JsonObject = secrets.redact_json(redact_json(brief, step_secrets([step])))
    return masked


def combine(checked: Verification, judged: Verification, judge: str = "model") -> Verification:
    """The machine checks' verdict and the judge's, as one: `fail` if either failed; the
    judge's findings named ``<judge>:<check>``."""
    findings = [
        *checked.findings,
        *(
            Finding(check=f"{judge}:{f.check}", passed=f.passed, detail=f.detail)
            for f in judged.findings
        ),
    ]
    if judged.status == "fail" and all(f.passed for f in judged.findings):
        # A `fail` with no failed finding still needs one, so the record says who failed it.
        findings.append(Finding(check=judge, passed=False, detail="the judge answered fail"))
    failed = checked.status == "fail" or judged.status == "fail"
    actions = [*checked.recommended_actions, *judged.recommended_actions] if failed else []
    return Verification(
        status="fail" if failed else "pass",
        findings=tuple(findings),
        recommended_actions=tuple(actions),
    )
