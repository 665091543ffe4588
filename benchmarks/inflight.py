"""1,000 workflows in flight whose jobs each take 200 ms: peak RSS and share of ideal throughput.

Runs the engine in-process (simulated worker: each of the 3 steps is `sleep 0.2`) in this
process alone, so `ru_maxrss` is the engine's. Ideal throughput is in-flight / job time jobs
per second (1,000 / 0.2 s = 5,000 jobs/s); the share is what was achieved over that.

    .venv/bin/python benchmarks/inflight.py [--workflows 1000] [--job-seconds 0.2]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from contenders import STEPS, engine_settings

from workflow_engine.api.requests import task_from_proto
from workflow_engine.app import Engine
from workflow_engine.logs import configure_logging
from workflow_engine.storage.embedded import start_embedded_postgres
from workflow_engine.v1 import workflow_engine_pb2 as pb

PGDATA = Path(__file__).resolve().parent.parent / ".data" / "bench-pgdata"


async def run(server: str, workflows: int, job_seconds: float) -> dict[str, float]:
    db = f"inflight_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(server, autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {db}")
    spec = task_from_proto(
        pb.TaskSpec(
            steps=[pb.Step(id=f"s{i}", command=["sleep", str(job_seconds)]) for i in range(STEPS)]
        )
    )
    with tempfile.TemporaryDirectory() as tmp:
        settings = engine_settings(make_conninfo(server, dbname=db), Path(tmp), 20)
        engine = await Engine.start(
            settings.with_overrides(lease_ttl_seconds=120, max_running_jobs=workflows)
        )
        rss_idle = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        ids = [str(uuid.uuid4()) for _ in range(workflows)]
        t0 = time.perf_counter()
        for task_id in ids:
            await engine.service.start(
                task_id=task_id, holder_id="", idempotency_key=None, task=spec
            )
        for task_id in ids:
            await engine.runs.wait(task_id, 600)
        elapsed = time.perf_counter() - t0
        await engine.close()
    async with await psycopg.AsyncConnection.connect(server, autocommit=True) as admin:
        await admin.execute(f"DROP DATABASE {db} WITH (FORCE)")
    jobs = workflows * STEPS
    ideal_jobs_per_s = workflows / job_seconds
    return {
        "workflows_in_flight": workflows,
        "job_seconds": job_seconds,
        "elapsed_s": round(elapsed, 2),
        "jobs_per_s": round(jobs / elapsed, 1),
        "ideal_jobs_per_s": ideal_jobs_per_s,
        "share_of_ideal": round(jobs / elapsed / ideal_jobs_per_s, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_rss_at_engine_start_mb": round(rss_idle / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--job-seconds", type=float, default=0.2)
    args = parser.parse_args()
    configure_logging("warning")
    with start_embedded_postgres(PGDATA) as server:
        print(json.dumps(asyncio.run(run(server.url, args.workflows, args.job_seconds))))


if __name__ == "__main__":
    main()
