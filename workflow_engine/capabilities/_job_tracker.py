"""Runs a workflow's dispatched jobs at the same time, and keeps them running across nodes.

`collect_result` hands over every job in flight and gets back those that have finished, as
soon as at least one has: the graph checkpoints those results and verifies them while the rest
keep running. A job is one asyncio task here, around the worker's idempotent `run`, so asking
for it again (the next `collect_result`) waits on the same task instead of starting anything.
After a restart there is no task, and the worker re-attaches by job id.

Before a job is handed to the worker, `admit` (set by the run manager) checks under the fence
that its workflow's runner still holds the lease, so no job starts for a workflow that was
cancelled or taken over. `cancel` stops a workflow's jobs (the worker kills them); `forget`
only stops waiting for them (a run that stops for a restart leaves its jobs running, to be
re-attached by whoever resumes it).

A per-process number of slots bounds how many jobs run at once across all workflows, shared
fairly among tenants (`fair_slots`: the next free slot goes to the waiting tenant with the
fewest running); a job waiting for a slot is dispatched (recorded in the checkpoint) but not
yet started. Its tenant is its workflow's project, as `tenant_of` (set by the run manager)
tells.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

import structlog

from workflow_engine.capabilities._fair_slots import FairSlots
from workflow_engine.capabilities._protocols import Worker
from workflow_engine.domain.held import Held
from workflow_engine.domain.jobs import JobRequest, JobResult
from workflow_engine.domain.task import LOADER_PROBLEM, loader_variables
from workflow_engine.errors import InvalidArgument
from workflow_engine.telemetry import Metrics, tracing

log = structlog.get_logger(__name__)

#: Raises (a control exception) when the job's workflow may not start a job now.
Admission = Callable[[JobRequest], Awaitable[None]]


async def _admit_all(job: JobRequest) -> None:
    """No run manager to ask (tests driving the graph without one): every job may start."""


def _one_tenant(task_id: str) -> str:
    """No run manager to ask: every workflow's jobs are one tenant's."""
    return ""


class JobTracker:
    """The jobs of this process, by job id; see the module docstring."""

    def __init__(
        self,
        worker: Worker,
        *,
        max_running: int,
        max_running_per_tenant: int = 0,
        metrics: Metrics | None = None,
    ) -> None:
        self._worker = worker
        self._metrics = Metrics() if metrics is None else metrics  # the engine's
        self.slots = FairSlots(max_running, per_tenant=max_running_per_tenant)
        self._tasks: dict[str, asyncio.Task[JobResult]] = {}
        # Every job this process waits on, by its workflow's task id (job id -> target, job).
        self._by_workflow: dict[str, dict[str, tuple[str, JobRequest]]] = {}
        self.admit: Admission = _admit_all
        #: The tenant (project) of a workflow's jobs, by its task id.
        self.tenant_of: Callable[[str], str] = _one_tenant

    async def wait_any(
        self, jobs: Sequence[tuple[str, JobRequest]]
    ) -> dict[str, JobResult | BaseException]:
        """Start or re-join `jobs` ((target, request) pairs); return those that ended, by job id.

        Returns once at least one has ended; a job whose worker raised maps to its exception.
        """
        for target, job in jobs:
            self._by_workflow.setdefault(job.task_id, {})[job.job_id] = (target, job)
        if len(jobs) == 1 and jobs[0][1].job_id not in self._tasks:
            # The common, sequential case: nothing to overlap, so no task to keep across nodes.
            target, job = jobs[0]
            try:
                outcome: JobResult | BaseException = await self._run(target, job)
            except Exception as exc:
                outcome = exc
            self._done(job)
            return {job.job_id: outcome}
        tasks = {job.job_id: self._task(target, job) for target, job in jobs}
        await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_COMPLETED)
        ended: dict[str, JobResult | BaseException] = {}
        for _, job in jobs:
            task = tasks[job.job_id]
            if task.done():
                self._done(job)
                if task.cancelled():
                    ended[job.job_id] = asyncio.CancelledError(f"job {job.job_id} was cancelled")
                else:
                    ended[job.job_id] = task.exception() or task.result()
        return ended

    def held(self) -> list[Held]:
        """Jobs waited on, by job and by workflow: each ends with its job, or its run."""
        return [
            Held("jobs.tasks", len(self._tasks)),
            Held("jobs.workflows", len(self._by_workflow)),
            *self.slots.held(),
        ]

    def forget(self, task_id: str) -> None:
        """Stop waiting on `task_id`'s jobs (its run ended); the worker's jobs are not killed."""
        for job_id in self._by_workflow.pop(task_id, {}):
            task = self._tasks.pop(job_id, None)
            if task is not None:
                task.cancel()

    async def cancel(self, task_id: str, also: Iterable[tuple[str, JobRequest]] = ()) -> None:
        """Stop `task_id`'s jobs: the ones waited on here and `also` (e.g. from its state)."""
        jobs = {job.job_id: (target, job) for target, job in also}
        jobs.update(self._by_workflow.get(task_id, {}))
        self.forget(task_id)
        for target, job in jobs.values():
            try:
                await self._worker.cancel(target, job)
            except Exception as exc:  # the job runs on; say so, and go on with the others
                log.warning("job_cancel_failed", job_id=job.job_id, error=repr(exc))
            else:
                log.info("job_cancelled", job_id=job.job_id, task_id=task_id, step_id=job.step_id)

    def _done(self, job: JobRequest) -> None:
        self._tasks.pop(job.job_id, None)
        mine = self._by_workflow.get(job.task_id)
        if mine is not None:
            mine.pop(job.job_id, None)
            if not mine:
                del self._by_workflow[job.task_id]

    def _task(self, target: str, job: JobRequest) -> asyncio.Task[JobResult]:
        task = self._tasks.get(job.job_id)
        if task is None:
            task = asyncio.create_task(self._run(target, job), name=f"job-{job.job_id}")
            self._tasks[job.job_id] = task
        return task

    async def _run(self, target: str, job: JobRequest) -> JobResult:
        if refused := loader_variables(job.sandbox.env):
            # Dispatched by an earlier version, which did not refuse them: never started.
            raise InvalidArgument(f"sandbox.env[{refused[0]}]", LOADER_PROBLEM)
        async with self.slots.slot(self.tenant_of(job.task_id)):
            await self.admit(job)
            with tracing.span(
                f"job {job.step_id}",
                {
                    "workflow_engine.task_id": job.task_id,
                    "workflow_engine.job_id": job.job_id,
                    "workflow_engine.attempt": job.attempt,
                    "workflow_engine.worker": target,
                },
            ) as span:
                self._metrics.job_started(target)
                started = time.perf_counter()
                status = "error"
                try:
                    result = await self._worker.run(target, job)
                    status = result.status
                    span.set_attribute("workflow_engine.job_status", status)
                    return result
                finally:
                    self._metrics.job_ended(target, status, time.perf_counter() - started)
