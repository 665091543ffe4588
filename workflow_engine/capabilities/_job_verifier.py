"""The ``job`` verifier: machine checks, then a verification job on the worker.

Seed 004's Project Analyst: the Project Manager Agent tasks a sub-agent running in a sandbox
with the verification and reads its verdict back. The job runs `WORKFLOW_ENGINE_VERIFIER_COMMAND`
on the same worker as the steps (the local sandbox, or a worker node), with what it is to judge
as JSON in ``WORKFLOW_ENGINE_VERIFY_INPUT`` (the step, bounded excerpts of its result, the
acceptance criteria, the preferences, the machine checks' verdict); its stdout's last line that
is a JSON object is its verdict, in the state's `verification` shape. The job's id is fixed by
the result it judges, so a verification re-run after a crash re-attaches to the same job.

As with the ``llm`` verifier, a failed machine check fails the step whatever the job says, and
a job that fails or answers no verdict is a failed finding saying so.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from workflow_engine._masking import Secrets, for_workflow, step_secrets
from workflow_engine.capabilities._job_tracker import JobTracker
from workflow_engine.capabilities._machine_verifier import MachineVerifier
from workflow_engine.capabilities._protocols import Worker
from workflow_engine.capabilities.model import checked_brief, combine
from workflow_engine.domain.jobs import Finding, JobRequest, JobResult, Sandbox, Verification
from workflow_engine.domain.task import AcceptanceCriterion, Step
from workflow_engine.domain.values import parse
from workflow_engine.errors import InvalidArgument

#: Namespace of verification job ids: uuid5(VERIFY_NAMESPACE, "<judged job id>/verify").
VERIFY_NAMESPACE = uuid.UUID("0f6b1f6e-61a4-4c55-9d0e-3f1a3c2d9e70")
INPUT_VARIABLE = "WORKFLOW_ENGINE_VERIFY_INPUT"


class JobVerifier:
    """Machine checks, then the verdict of a verification job; the stricter wins."""

    def __init__(
        self,
        worker: Worker,
        jobs: JobTracker,
        command: Sequence[str],
        *,
        timeout_seconds: int = 600,
        excerpt_chars: int = 4000,
        secrets: Secrets | None = None,
    ) -> None:
        self._worker = worker
        self._jobs = jobs
        self._command = tuple(command)
        self._timeout = timeout_seconds
        self._excerpt_chars = excerpt_chars
        #: The engine's secrets, masked in what the job is shown and in the findings.
        self._secrets = Secrets() if secrets is None else secrets  # an empty one is falsy
        self._machine = MachineVerifier(secrets=self._secrets)

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
            self._excerpt_chars,
            self._secrets,
            secrets,
        )
        job = JobRequest(
            task_id=result.task_id,
            job_id=str(uuid.uuid5(VERIFY_NAMESPACE, f"{result.job_id}/verify")),
            sandbox=Sandbox(
                command=self._command,
                env={INPUT_VARIABLE: json.dumps(brief)},
                timeout_seconds=self._timeout,
            ),
            step_id=f"{step.id}.verify",
            run_id=run_id,
            required_labels=step.required_labels,
        )
        target = await self._worker.select_target(job)
        # Through the engine's job tracker, as the steps' jobs: admitted under the run's fence,
        # counted against the running-jobs limit, and stopped with its workflow.
        outcome = (await self._jobs.wait_any([(target, job)]))[job.job_id]
        if isinstance(outcome, BaseException):
            raise outcome
        masking = for_workflow(self._secrets, {*secrets, *step_secrets([step])})
        return combine(checked, read_verdict(outcome, masking), judge="analyst")


def read_verdict(ran: JobResult, secrets: Secrets) -> Verification:
    """The verdict a verification job printed, or a failed finding saying why there is none
    (quoting its output with `secrets` masked)."""
    if ran.status != "completed" or ran.exit_code != 0:
        stderr = secrets.quoted(ran.stderr, 300, keep="tail")
        why = f"status {ran.status}, exit code {ran.exit_code}; stderr {stderr}"
        return _no_verdict(f"the verification job did not succeed ({why})")
    for line in reversed(ran.stdout.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            verdict: Verification = parse(Verification, json.loads(line), "verdict")
            return verdict
        except ValueError as exc:
            return _no_verdict(f"the verification job's verdict is not JSON: {exc}")
        except InvalidArgument as exc:
            return _no_verdict(f"the verification job's verdict is invalid: {exc.message}")
    return _no_verdict(
        f"the verification job printed no verdict: {secrets.quoted(ran.stdout, 300, keep='tail')}"
    )


def _no_verdict(detail: str) -> Verification:
    finding = Finding(check="verdict", passed=False, detail=detail)
    return Verification(status="fail", findings=(finding,), recommended_actions=(detail,))
