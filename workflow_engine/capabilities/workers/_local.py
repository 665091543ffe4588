"""The embedded worker: runs each job as a local process, once per job id, surviving restarts.

A job lives in ``jobs_dir/<job_id>/`` (the layout is in `sandbox._files`). Creating that directory
claims the job, so a second run with the same id (a retry of `collect_result`, or a restarted
engine) never starts the command again; it waits for the first run's result instead. If the job
vanished without a result, it is reported lost (failed), still without running it again. The
engine's job ids are its own (`graph._nodes.job_id_for`: a digest of task, step and attempt), so
no caller picks the id of another task's job; a worker node, whose clients send ids of their
choosing, refuses one of another task (`worker_node._job_runs`) by `recorded_task_id`.
`sandbox._runner` does the work, and says how a job stays that cheap and yet outlives the engine;
a worker node serving the Worker API runs its jobs through the same runner.

`cancel` stops a job for good: it claims the directory of a job that has not started (so it
never will, and a later `run` of that id reads the cancelled result), or marks a started one
cancelled and stops the command's whole process group (SIGTERM, then SIGKILL after a grace
period), recording the result as cancelled.

A job runs with only what it was granted (`sandbox._grant`): no network, its own user when the
engine is root, resource limits from the settings and the step; a job that asks for what this
host cannot enforce (an image, labels, or no network where namespaces are not allowed) is
refused with a finding; a step that asks for an image or labels is refused before that, at
start or when a model plans it (`unfit`).

A finished job's directory is kept for `retention_seconds` after its result, then removed (a
job id sent again after that runs again); see `sandbox._runner`.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from workflow_engine.domain.held import Held
from workflow_engine.domain.jobs import JobRequest, JobResult
from workflow_engine.domain.task import Step
from workflow_engine.sandbox import TARGET, Confinement, JobRunner, step_unfit

__all__ = ["TARGET", "LocalSandboxWorker"]


class LocalSandboxWorker:
    """Runs jobs on this machine in a fresh work directory with a minimal environment."""

    def __init__(
        self,
        *,
        jobs_dir: Path,
        default_timeout_seconds: int = 3600,
        max_output_bytes: int = 64 * 1024,
        poll_interval: float = 0.05,
        confinement: Confinement | None = None,
        retention_seconds: float = 0,
    ) -> None:
        self._runner = JobRunner(
            jobs_dir=jobs_dir,
            default_timeout_seconds=default_timeout_seconds,
            max_output_bytes=max_output_bytes,
            poll_interval=poll_interval,
            confinement=confinement,
            retention_seconds=retention_seconds,
        )

    async def __aenter__(self) -> LocalSandboxWorker:
        """Remove finished jobs' directories once `retention_seconds` have passed (0: never)."""
        self._runner.start_pruning()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop following the jobs still running; the next engine re-attaches them."""
        await self._runner.close()

    def unfit(self, step: Step) -> tuple[str, str] | None:
        """A step that asks for an image or labels would never run here."""
        return step_unfit(step.image, step.required_labels)

    async def select_target(self, job: JobRequest) -> str:
        """Every job runs here."""
        return TARGET

    async def run(self, target: str, job: JobRequest) -> JobResult:
        """Start the job unless it exists, then wait for its result (see the module docstring)."""
        result = await self._runner.run(job)
        return result.model_copy(update={"target": target})

    def held(self) -> list[Held]:
        return self._runner.held()

    def recorded_task_id(self, job_id: str) -> str | None:
        """The task `job_id`'s job was first sent for (None: no such job, or not known yet)."""
        return self._runner.recorded_task_id(job_id)

    async def cancel(self, target: str, job: JobRequest) -> None:
        """Stop the job; see the module docstring. Returns without waiting for it to end."""
        await self._runner.cancel(job)
