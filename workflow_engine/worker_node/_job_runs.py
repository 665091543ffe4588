"""The node's jobs: each job_id run once through the local sandbox, awaited by every request.

The local sandbox's job directories (under the node's data directory) are what make a job_id
run once, across restarts of the node too: a job_id that already has a directory is never
started again; its result is read, or awaited while the job runs. Within one node process this
module adds one task per running job_id, which every request for it awaits, so a repeated
request neither starts nor polls a second time, and a client that hangs up (its engine died)
leaves the job running for the next request with that id.

A job_id belongs to the task that first sent it. Whoever holds the node's token chooses the
ids it sends, and a job_id is answered with that job's output, so a request (or a cancel) that
names a job_id of another task is refused (`JobOfAnotherTask`) before anything runs or
changes: the task is the one this process runs it for, else the one its directory records
(`LocalSandboxWorker.recorded_task_id`; a job cancelled before it started, with no task named,
records none and belongs to whichever task sends it).

Draining (SIGTERM) refuses new job ids; requests for a job this process is running are still
answered, and `wait_idle` tells when none is left.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from workflow_engine.capabilities.workers import LocalSandboxWorker
from workflow_engine.domain.held import Held
from workflow_engine.domain.jobs import JobRequest, JobResult, Sandbox
from workflow_engine.errors import Draining, JobOfAnotherTask
from workflow_engine.sandbox import TARGET

log = structlog.get_logger(__name__)

#: The task id recorded for a job cancelled before it started when the cancel did not say.
NIL_TASK_ID = "00000000-0000-0000-0000-000000000000"


class NodeJobs:
    """The running jobs of this node process, by job_id, over one `LocalSandboxWorker`."""

    def __init__(self, runner: LocalSandboxWorker) -> None:
        self._runner = runner
        self._running: dict[str, tuple[JobRequest, asyncio.Task[JobResult]]] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self.draining = False

    @property
    def running(self) -> int:
        return len(self._running)

    def held(self) -> list[Held]:
        """Jobs running here (each ends with its job), and the sandbox's own (`domain.held`)."""
        return [Held("node.jobs", len(self._running)), *self._runner.held()]

    async def run(self, job: JobRequest) -> JobResult:
        """The job's result: from its first run, whenever and by whichever process that was."""
        entry = self._running.get(job.job_id)
        self._check_task(job.job_id, job.task_id, entry)
        if entry is None:
            if self.draining:
                raise Draining(f"the node is draining; job {job.job_id} not started")
            task = asyncio.create_task(self._run(job), name=f"node-job-{job.job_id}")
            self._running[job.job_id] = (job, task)
            self._idle.clear()
        else:
            log.info("node_job_awaited", job_id=job.job_id, task_id=job.task_id)
            task = entry[1]
        # Shielded: one request cancelled (the server's shutdown cancels those still open) must
        # not cancel the task that other requests for the same job_id await.
        return await asyncio.shield(task)

    async def cancel(self, job_id: str, task_id: str | None) -> None:
        """Stop the job for good: a running one is stopped, one not started never starts."""
        entry = self._running.get(job_id)
        if task_id is not None:
            self._check_task(job_id, task_id, entry)
        if entry is not None:
            job = entry[0]
        else:
            # Only its id matters to the runner; the command is never run.
            job = JobRequest(
                task_id=task_id or NIL_TASK_ID, job_id=job_id, sandbox=Sandbox(command=())
            )
        await self._runner.cancel(TARGET, job)
        log.info("node_job_cancel_requested", job_id=job_id, running=entry is not None)

    def _check_task(
        self, job_id: str, task_id: str, entry: tuple[JobRequest, object] | None
    ) -> None:
        """Refuse `task_id` a job_id that belongs to another task (see the module docstring)."""
        owner = entry[0].task_id if entry is not None else self._runner.recorded_task_id(job_id)
        if owner in (None, NIL_TASK_ID, task_id):
            return
        log.warning("node_job_of_another_task", job_id=job_id, task_id=task_id, owner=owner)
        raise JobOfAnotherTask(job_id)

    async def wait_idle(self, seconds: float) -> bool:
        """Whether every job of this process ended within `seconds`."""
        try:
            async with asyncio.timeout(seconds):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def _run(self, job: JobRequest) -> JobResult:
        started = time.monotonic()
        try:
            result = await self._runner.run(TARGET, job)
        finally:
            self._running.pop(job.job_id, None)
            if not self._running:
                self._idle.set()
        log.info(
            "node_job_result",
            job_id=job.job_id,
            task_id=job.task_id,
            status=result.status,
            exit_code=result.exit_code,
            seconds=round(time.monotonic() - started, 3),
        )
        return result
