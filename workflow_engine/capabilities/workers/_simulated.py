"""A worker that simulates jobs in-process, for benchmarks and dry runs (no processes, no disk).

It understands three argv shapes: ``true`` (exit 0), ``echo ...`` (prints its arguments) and
``sleep <seconds>`` (waits without blocking the event loop, like a job that takes that long).
Anything else fails with exit code 127, as a missing program would. Results have the Worker
API's shape, so the graph cannot tell it from a real worker; re-running a job id returns the
first result, as a real worker's deduplication would (within this process's lifetime).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from workflow_engine.domain.held import Held
from workflow_engine.domain.jobs import JobRequest, JobResult
from workflow_engine.domain.task import Step

#: Results kept for a job id run again (a real worker keeps them on disk), oldest dropped first:
#: a few times the jobs an engine runs at once (`max_running_jobs`, 64 by default).
REMEMBERED_RESULTS = 4096


class SimulatedWorker:
    """`Worker` for measuring the engine's own cost; see the module docstring."""

    def __init__(self, *, max_remembered: int = REMEMBERED_RESULTS) -> None:
        self._results: dict[str, JobResult] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._max = max_remembered

    def unfit(self, step: Step) -> tuple[str, str] | None:
        """Every step can be simulated."""
        return None

    def held(self) -> list[Held]:
        return [
            Held("simulated.results", len(self._results), self._max),
            Held("simulated.sleeping", len(self._running)),
        ]

    async def select_target(self, job: JobRequest) -> str:
        return "simulated"

    async def run(self, target: str, job: JobRequest) -> JobResult:
        done = self._results.get(job.job_id)
        if done is not None:
            return done
        started = datetime.now(UTC).isoformat()
        program, *args = job.sandbox.command
        exit_code, stdout, stderr = 0, "", ""
        if program == "sleep" and len(args) == 1:
            try:
                seconds = float(args[0])
            except ValueError:
                exit_code, stderr = 1, f"sleep: invalid time interval {args[0]!r}"
            else:
                sleeping = asyncio.ensure_future(asyncio.sleep(seconds))
                self._running[job.job_id] = sleeping
                try:
                    await asyncio.shield(sleeping)
                finally:
                    self._running.pop(job.job_id, None)
                if sleeping.cancelled():  # cancel() recorded the result meanwhile
                    return self._results[job.job_id]
        elif program == "echo":
            stdout = " ".join(args) + "\n"
        elif program != "true":
            exit_code, stderr = 127, f"{program}: not simulated"
        result = JobResult(
            task_id=job.task_id,
            job_id=job.job_id,
            status="completed" if exit_code == 0 else "failed",
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            started_at=started,
            ended_at=datetime.now(UTC).isoformat(),
            target=target,
        )
        return self._remember(result)

    async def cancel(self, target: str, job: JobRequest) -> None:
        """Record the job as cancelled unless it ended; a sleeping one stops sleeping."""
        if job.job_id in self._results:
            return
        now = datetime.now(UTC).isoformat()
        self._remember(
            JobResult(
                task_id=job.task_id,
                job_id=job.job_id,
                status="cancelled",
                exit_code=None,
                stdout="",
                stderr="cancelled",
                started_at=now,
                ended_at=now,
                target=target,
            )
        )
        sleeping = self._running.pop(job.job_id, None)
        if sleeping is not None:
            sleeping.cancel()

    def _remember(self, result: JobResult) -> JobResult:
        if len(self._results) >= self._max:
            self._results.pop(next(iter(self._results)))
        self._results[result.job_id] = result
        return result
