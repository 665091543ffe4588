"""What one local job costs: CPU in the engine and in the job's processes, per `true` job.

Runs `true` through the default worker (`LocalSandboxWorker`, the job runner behind it) at
concurrency 20, with no database and no graph, so the figures are the job path's alone:
the engine's CPU (this process: spawning, waiting, files, result) and its children's
(`jobwrap` and the command).
`job_profile.py` says where the children's part goes.

    .venv/bin/python benchmarks/job_cost.py [--jobs 600] [--concurrency 20] [--jobs-per-task 3]
        [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import tempfile
import time
from pathlib import Path

from workflow_engine._logs import configure_logging
from workflow_engine.capabilities.workers._local import LocalSandboxWorker
from workflow_engine.domain.jobs import JobRequest, Sandbox


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


async def measure(jobs: int, concurrency: int, per_task: int, data_dir: Path | None) -> None:
    place = contextlib.nullcontext(tempfile.mkdtemp(dir=data_dir)) if data_dir else None
    with place or tempfile.TemporaryDirectory() as tmp:
        slots = asyncio.Semaphore(concurrency)

        async def one(worker: LocalSandboxWorker, job_id: str) -> None:
            # A task's jobs share its namespaces (job_namespaces): a task per `per_task` jobs.
            task_id = (
                f"{job_id.rpartition('-')[0]}-task-{int(job_id.rpartition('-')[2]) // per_task}"
            )
            request = JobRequest(task_id=task_id, job_id=job_id, sandbox=Sandbox(command=("true",)))
            async with slots:
                result = await worker.run("local", request)
            assert result.status == "completed", result

        # A runner of its own for the warm-up: the children's CPU is counted once they are
        # reaped, and the namespace helper is reaped when its runner closes.
        async with LocalSandboxWorker(jobs_dir=Path(tmp) / "jobs") as worker:
            await asyncio.gather(*(one(worker, f"warm-{i}") for i in range(40)))
        engine0 = cpu_seconds(resource.RUSAGE_SELF)
        children0 = cpu_seconds(resource.RUSAGE_CHILDREN)
        async with LocalSandboxWorker(jobs_dir=Path(tmp) / "jobs") as worker:
            wall0 = time.perf_counter()
            await asyncio.gather(*(one(worker, f"job-{i}") for i in range(jobs)))
            wall = time.perf_counter() - wall0
        engine = cpu_seconds(resource.RUSAGE_SELF) - engine0
        children = cpu_seconds(resource.RUSAGE_CHILDREN) - children0
    print(
        f"{jobs} `true` jobs ({per_task} per task) at concurrency {concurrency}: engine"
        f" {engine / jobs * 1000:.3f} ms of CPU per job, its processes"
        f" {children / jobs * 1000:.3f} ms, {jobs / wall:.0f} jobs/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument(
        "--jobs-per-task", type=int, default=3, help="as many as the bench's workflows have steps"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="keep the job directories in a new directory here (default: a temporary one, "
        "removed at the end; on ext4 without a journal, removing them slows the next run)",
    )
    args = parser.parse_args()
    configure_logging("warning")
    asyncio.run(measure(args.jobs, args.concurrency, args.jobs_per_task, args.data_dir))


if __name__ == "__main__":
    main()
