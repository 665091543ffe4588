"""What one local job costs: CPU in the engine and in the job's processes, per `true` job.

Runs `true` through the default worker (`LocalSandboxWorker`, the job runner behind it) at
concurrency 20, with no database and no graph, so the figures are the job path's alone:
the engine's CPU (this process: spawning, waiting, files, result) and its children's
(`jobwrap`, or the `/bin/sh` supervisor where it was not built, and the command).
`job_profile.py` says where the children's part goes.

    .venv/bin/python benchmarks/job_cost.py [--jobs 600] [--concurrency 20]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from pathlib import Path

from workflow_engine.capabilities.sandbox import LocalSandboxWorker
from workflow_engine.domain.jobs import JobRequest, Sandbox
from workflow_engine.logs import configure_logging


def cpu_seconds(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


async def measure(jobs: int, concurrency: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with LocalSandboxWorker(jobs_dir=Path(tmp) / "jobs") as worker:
            slots = asyncio.Semaphore(concurrency)

            async def one(job_id: str) -> None:
                request = JobRequest(task_id="t", job_id=job_id, sandbox=Sandbox(command=("true",)))
                async with slots:
                    result = await worker.run("local", request)
                assert result.status == "completed", result

            await asyncio.gather(*(one(f"warm-{i}") for i in range(40)))
            engine0 = cpu_seconds(resource.RUSAGE_SELF)
            children0 = cpu_seconds(resource.RUSAGE_CHILDREN)
            wall0 = time.perf_counter()
            await asyncio.gather(*(one(f"job-{i}") for i in range(jobs)))
            wall = time.perf_counter() - wall0
            engine = cpu_seconds(resource.RUSAGE_SELF) - engine0
            children = cpu_seconds(resource.RUSAGE_CHILDREN) - children0
    print(
        f"{jobs} `true` jobs at concurrency {concurrency}: engine {engine / jobs * 1000:.3f} ms"
        f" of CPU per job, its processes {children / jobs * 1000:.3f} ms, {jobs / wall:.0f} jobs/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=20)
    args = parser.parse_args()
    configure_logging("warning")
    asyncio.run(measure(args.jobs, args.concurrency))


if __name__ == "__main__":
    main()
