"""Runs a workflow's dispatched jobs at the same time, and keeps them running across nodes.

`collect_result` hands over every job in flight and gets back those that have finished, as
soon as at least one has: the graph checkpoints those results and verifies them while the rest
keep running. A job is one asyncio task here, around the worker's idempotent `run`, so asking
for it again (the next `collect_result`) waits on the same task instead of starting anything.
After a restart there is no task, and the worker re-attaches by job id.

A per-process semaphore bounds how many jobs run at once across all workflows; a job waiting for
a slot is dispatched (recorded in the checkpoint) but not yet started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from workflow_engine.capabilities.base import JobRequest, JobResult, Worker


class JobTracker:
    """The jobs of this process, by job id; see the module docstring."""

    def __init__(self, worker: Worker, *, max_running: int) -> None:
        self._worker = worker
        self._slots = asyncio.Semaphore(max_running)
        self._tasks: dict[str, asyncio.Task[JobResult]] = {}
        self._task_ids: dict[str, str] = {}  # job id -> the workflow's task id

    async def wait_any(
        self, jobs: Sequence[tuple[str, JobRequest]]
    ) -> dict[str, JobResult | BaseException]:
        """Start or re-join `jobs` ((target, request) pairs); return those that ended, by job id.

        Returns once at least one has ended; a job whose worker raised maps to its exception.
        """
        if len(jobs) == 1 and jobs[0][1].job_id not in self._tasks:
            # The common, sequential case: nothing to overlap, so no task to keep across nodes.
            target, job = jobs[0]
            try:
                return {job.job_id: await self._run(target, job)}
            except Exception as exc:
                return {job.job_id: exc}
        tasks = {job.job_id: self._task(target, job) for target, job in jobs}
        await asyncio.wait(tasks.values(), return_when=asyncio.FIRST_COMPLETED)
        ended: dict[str, JobResult | BaseException] = {}
        for job_id, task in tasks.items():
            if task.done():
                del self._tasks[job_id]
                del self._task_ids[job_id]
                if task.cancelled():
                    ended[job_id] = asyncio.CancelledError(f"job {job_id} was cancelled")
                else:
                    ended[job_id] = task.exception() or task.result()
        return ended

    def forget(self, task_id: str) -> None:
        """Stop waiting on `task_id`'s jobs (its run ended); the worker's jobs are not killed."""
        for job_id, owner in list(self._task_ids.items()):
            if owner == task_id:
                self._tasks.pop(job_id).cancel()
                del self._task_ids[job_id]

    def _task(self, target: str, job: JobRequest) -> asyncio.Task[JobResult]:
        task = self._tasks.get(job.job_id)
        if task is None:
            task = asyncio.create_task(self._run(target, job), name=f"job-{job.job_id}")
            self._tasks[job.job_id] = task
            self._task_ids[job.job_id] = job.task_id
        return task

    async def _run(self, target: str, job: JobRequest) -> JobResult:
        async with self._slots:
            return await self._worker.run(target, job)
