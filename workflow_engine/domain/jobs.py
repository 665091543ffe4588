"""Jobs and their judgement: a request and result in the Worker API's shapes, and a verdict.

`JobRequest` and `JobResult` are the Worker API's JSON (`POST /v1/worker/jobs:run`, version 1)
field for field, plus what the engine adds (attempt, step, remediation, context, the labels a
node must and should have; the node that ran it, the artifacts it listed). `Verification` is
the state model's `verification`; its JSON Schema is what a model judging results must answer
with.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import Field

from workflow_engine.domain.values import DomainModel, JsonObject

#: A job's end: the Worker API's three, and `cancelled` (its workflow was cancelled; the worker
#: stopped it).
JobStatus = Literal["completed", "failed", "timeout", "cancelled"]
VerificationStatus = Literal["pass", "fail"]
WORKER_API_VERSION = 1


#: The largest value of any one limit (a 32-bit signed int: what the proto carries).
MAX_LIMIT = 2**31 - 1
LimitValue = Annotated[int, Field(ge=0, le=MAX_LIMIT)]


class Limits(DomainModel):
    """What a job may use; 0 leaves a limit to the worker, whose own settings cap each one.

    `memory_mb` is the job's address space per process, `output_mb` the largest file it may
    write (its stdout and stderr included), `processes` the processes and threads it may have
    at once, `cpu_seconds` its CPU time per process.
    """

    cpu_seconds: LimitValue = 0
    memory_mb: LimitValue = 0
    open_files: LimitValue = 0
    processes: LimitValue = 0
    output_mb: LimitValue = 0


class Sandbox(DomainModel):
    """Where and how a job's command runs."""

    image: str = ""
    command: tuple[str, ...]
    env: dict[str, str] = Field(default_factory=dict)
    timeout_seconds: int = 0
    network_policy: str = "restricted"
    limits: Limits = Field(default_factory=Limits)


class JobRequest(DomainModel):
    """A job to run.

    `job_id` is deterministic per task, run, step and attempt, so a worker that sees the same id
    twice returns the first run's result instead of running again. `run_id` is the workflow run
    the job belongs to (a task id used again, after its rows were pruned, is a new run): a worker
    keys what a task's jobs share (their user, namespaces and /tmp) by `workspace`, never by the
    task id alone. Empty for a workflow an engine before state format 4 started.

    `remediation` carries the previous attempt's failed findings; the local sandbox hands it to
    the command as ``WORKFLOW_ENGINE_REMEDIATION`` (JSON), beside ``WORKFLOW_ENGINE_ATTEMPT``.
    `context` holds the results of earlier steps (what this step depends on), compressed to a
    budget; the local sandbox hands it to the command as ``WORKFLOW_ENGINE_CONTEXT`` (JSON).
    """

    version: int = WORKER_API_VERSION
    task_id: str
    job_id: str
    sandbox: Sandbox
    attempt: int = 1
    step_id: str = ""
    remediation: tuple[str, ...] = ()
    context: tuple[JsonObject, ...] = ()
    #: Labels the node that runs it must have (the step's `required_labels`).
    required_labels: tuple[str, ...] = ()
    #: Labels that make a node preferred among equally loaded ones (the task's locality and
    #: model preferences).
    preferred_labels: tuple[str, ...] = ()
    run_id: str = ""

    @property
    def workspace(self) -> str:
        """What the jobs that may share a user, namespaces and /tmp on a worker have in common:
        their task and run (their task alone for a run that has no id)."""
        return f"{self.task_id}/{self.run_id}" if self.run_id else self.task_id


class TruncatedStreams(DomainModel):
    """Whether the worker cut a stream to its output limit."""

    stdout: bool = False
    stderr: bool = False


class JobResult(DomainModel):
    """A job's result.

    `exit_code` is set when the job completed or failed; `work_dir` is where the job ran, when
    the worker is local (checks such as `file_exists` look there); `target` names the node.
    `artifacts` are the descriptors a worker node listed (name, content type, size, ref), kept
    as links: inline content is left at the node.
    """

    version: int = WORKER_API_VERSION
    task_id: str
    job_id: str
    status: JobStatus
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    started_at: str = ""
    ended_at: str = ""
    truncated: TruncatedStreams = Field(default_factory=TruncatedStreams)
    work_dir: str | None = None
    target: str = ""
    artifacts: tuple[JsonObject, ...] = ()

    @classmethod
    def unrun(
        cls,
        job: JobRequest,
        status: JobStatus,
        reason: str,
        *,
        target: str,
        work_dir: str | None = None,
    ) -> JobResult:
        """The result of `job` when it did not run to an exit (lost, cancelled, refused): no
        exit code, `reason` as its stderr, started and ended now."""
        now = rfc3339()
        return cls(
            task_id=job.task_id,
            job_id=job.job_id,
            status=status,
            exit_code=None,
            stderr=reason,
            started_at=now,
            ended_at=now,
            work_dir=work_dir,
            target=target,
        )


def rfc3339(at: float | None = None) -> str:
    """UTC time (now, or the epoch seconds `at`) as the Worker API writes it: RFC 3339 with
    milliseconds and a Z."""
    moment = datetime.now(UTC) if at is None else datetime.fromtimestamp(at, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Finding(DomainModel):
    """One check's evidence: what was checked, whether it passed, and what was seen."""

    check: str
    passed: bool
    detail: str


class Verification(DomainModel):
    """The verdict on one job result: `pass` only if every finding passed."""

    status: VerificationStatus
    findings: tuple[Finding, ...]
    recommended_actions: tuple[str, ...] = ()
