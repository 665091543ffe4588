"""The narrow interfaces each graph node calls, and the values that cross them.

Every node does its work through one capability, chosen by configuration: the embedded defaults
in this package work offline; real integrations (the orchestrator's task table, an LLM planner,
the HTTP Worker API, an LLM judge) implement the same `Protocol`. `capabilities.factory` builds
the ones the settings name; one that owns resources is an async context manager, entered when
the engine starts and exited when it closes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from workflow_engine.spec import AcceptanceCriterion, JsonObject, Step, TaskSpec

#: A job's end: the Worker API's three, and `cancelled` (its workflow was cancelled; the worker
#: stopped it).
JobStatus = Literal["completed", "failed", "timeout", "cancelled"]
JOB_STATUSES = ("completed", "failed", "timeout", "cancelled")
VerificationStatus = Literal["pass", "fail"]
WORKER_API_VERSION = 1


@dataclass(frozen=True, slots=True)
class Plan:
    """Steps a worker can execute, and what the planner assumed to get there."""

    steps: tuple[Step, ...]
    assumptions: tuple[str, ...] = ()

    def to_json(self) -> JsonObject:
        return {
            "steps": [step.to_json() for step in self.steps],
            "assumptions": list(self.assumptions),
        }


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A job in the Worker API's request shape (`POST /v1/worker/jobs:run`, version 1).

    `job_id` is deterministic per task, step and attempt, so a worker that sees the same id twice
    returns the first run's result instead of running again. `remediation` carries the previous
    attempt's failed findings; the local sandbox hands it to the command as
    ``WORKFLOW_ENGINE_REMEDIATION`` (JSON), beside ``WORKFLOW_ENGINE_ATTEMPT``.
    """

    task_id: str
    job_id: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_seconds: int = 0
    image: str = ""
    network_policy: str = "restricted"
    attempt: int = 1
    step_id: str = ""
    remediation: tuple[str, ...] = ()
    #: Results of earlier steps (what this step depends on), compressed to a budget; the local
    #: sandbox hands it to the command as ``WORKFLOW_ENGINE_CONTEXT`` (JSON).
    context: tuple[JsonObject, ...] = ()

    def to_json(self) -> JsonObject:
        """The Worker API request body, plus the engine's attempt, step, remediation, context."""
        return {
            "version": WORKER_API_VERSION,
            "task_id": self.task_id,
            "job_id": self.job_id,
            "sandbox": {
                "image": self.image,
                "command": list(self.command),
                "env": dict(self.env),
                "timeout_seconds": self.timeout_seconds,
                "network_policy": self.network_policy,
            },
            "attempt": self.attempt,
            "step_id": self.step_id,
            "remediation": list(self.remediation),
            "context": [dict(entry) for entry in self.context],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobRequest:
        sandbox = data["sandbox"]
        return cls(
            task_id=str(data["task_id"]),
            job_id=str(data["job_id"]),
            command=tuple(str(a) for a in sandbox["command"]),
            env={str(k): str(v) for k, v in dict(sandbox.get("env") or {}).items()},
            timeout_seconds=int(sandbox.get("timeout_seconds") or 0),
            image=str(sandbox.get("image") or ""),
            network_policy=str(sandbox.get("network_policy") or "restricted"),
            attempt=int(data.get("attempt") or 1),
            step_id=str(data.get("step_id") or ""),
            remediation=tuple(str(r) for r in data.get("remediation") or ()),
            context=tuple(dict(entry) for entry in data.get("context") or ()),
        )


@dataclass(frozen=True, slots=True)
class JobResult:
    """A job result in the Worker API's response shape.

    `exit_code` is set when the job completed or failed; `work_dir` is where the job ran, when the
    worker is local (checks such as `file_exists` look there).
    """

    task_id: str
    job_id: str
    status: JobStatus
    exit_code: int | None
    stdout: str
    stderr: str
    started_at: str
    ended_at: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    work_dir: str | None = None
    target: str = ""

    def to_json(self) -> JsonObject:
        return {
            "version": WORKER_API_VERSION,
            "task_id": self.task_id,
            "job_id": self.job_id,
            "status": self.status,
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "truncated": {"stdout": self.stdout_truncated, "stderr": self.stderr_truncated},
            "work_dir": self.work_dir,
            "target": self.target,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobResult:
        truncated = data.get("truncated") or {}
        status = str(data["status"])
        if status not in JOB_STATUSES:
            raise ValueError(f"unknown job status {status!r}")
        exit_code = data.get("exit_code")
        return cls(
            task_id=str(data["task_id"]),
            job_id=str(data["job_id"]),
            status=status,  # type: ignore[arg-type]  # checked just above
            exit_code=None if exit_code is None else int(exit_code),
            stdout=str(data.get("stdout") or ""),
            stderr=str(data.get("stderr") or ""),
            started_at=str(data.get("started_at") or ""),
            ended_at=str(data.get("ended_at") or ""),
            stdout_truncated=bool(truncated.get("stdout", False)),
            stderr_truncated=bool(truncated.get("stderr", False)),
            work_dir=data.get("work_dir"),
            target=str(data.get("target") or ""),
        )


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's evidence: what was checked, whether it passed, and what was seen."""

    check: str
    passed: bool
    detail: str

    def to_json(self) -> JsonObject:
        return {"check": self.check, "passed": self.passed, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class Verification:
    """The verifier's verdict on one job result (the state model's `verification`)."""

    status: VerificationStatus
    findings: tuple[Finding, ...]
    recommended_actions: tuple[str, ...] = ()

    def to_json(self) -> JsonObject:
        return {
            "status": self.status,
            "findings": [f.to_json() for f in self.findings],
            "recommended_actions": list(self.recommended_actions),
        }


class TaskSource(Protocol):
    """Where `load_task_context` reads a task from."""

    async def load(self, task_id: str) -> TaskSpec:
        """Return the task; raise `WorkflowNotFound` when there is none."""
        ...

    def stored(self, task_id: str, spec: TaskSpec) -> None:
        """StartWorkflow stored `spec` with the workflow (a source may cache it, or ignore it)."""
        ...


class Planner(Protocol):
    """Turns a task into executable steps (`plan_steps`)."""

    async def plan(self, task: TaskSpec) -> Plan: ...

    def check(self, task: TaskSpec) -> None:
        """Raise `InvalidArgument` naming the field when `task` certainly cannot be planned.

        StartWorkflow calls it before anything is stored, so it must be cheap and pure: no I/O,
        no model call. Refuse only what this planner can tell up front (the static planner: no
        steps and no `$ command` lines); a task it might plan is accepted, and `plan` decides.
        """
        ...


class Worker(Protocol):
    """Runs jobs (`dispatch_step` chooses the target, `collect_result` runs or re-attaches)."""

    async def select_target(self, job: JobRequest) -> str:
        """Name the node the job should run on; must not start anything."""
        ...

    async def run(self, target: str, job: JobRequest) -> JobResult:
        """Run the job on `target` and return its result.

        Idempotent by `job.job_id`: if the job already ran, or is still running after this
        process restarted, return (or wait for) that run's result; never run it twice.
        """
        ...

    async def cancel(self, target: str, job: JobRequest) -> None:
        """Stop the job (its workflow was cancelled) and record its result as `cancelled`.

        A job that has not started must then never start (a later `run` of its id returns the
        cancelled result); one that has ended keeps its result. Idempotent; returns without
        waiting for the job to be gone.
        """
        ...


class Verifier(Protocol):
    """Judges a step's result (`verify_step_result`)."""

    async def verify(
        self,
        step: Step,
        result: JobResult,
        criteria: Sequence[AcceptanceCriterion],
    ) -> Verification:
        """Check `result` against the step's checks and, when given, the task's criteria."""
        ...


class ContextCompressor(Protocol):
    """Keeps the context handed to a dispatch within a budget (seed 001's accumulated context)."""

    async def compress(self, entries: Sequence[JsonObject], budget_chars: int) -> list[JsonObject]:
        """`entries` (oldest first, each ``{"step_id", "output", ...}``) within `budget_chars`."""
        ...
