"""Many workflows in flight: throughput against the ideal, peak RSS, and a newcomer's latency.

Runs the engine in-process (simulated worker: each of the 3 steps is `sleep <job seconds>`) in
this process alone, so `ru_maxrss` is the engine's. Starts `--workflows` of them, then, while
they are all in flight, `--probes` further workflows one after another whose steps take no
time: the gaps between a probe's consecutive node events (each stamped when its checkpoint
committed) are the engine's latency per node with everything else in flight. Then either waits
for every workflow to finish (throughput: jobs/s, against the ideal of in-flight / job time) or,
with `--no-wait`, closes the engine (for jobs too long to wait for).

    .venv/bin/python benchmarks/inflight.py [--workflows 1000] [--job-seconds 0.2]
        [--probes 10] [--no-wait]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import resource
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_postgres import run_on_bench_postgres
from contenders import STEPS, engine_settings, engine_task

from workflow_engine import Engine, Step, TaskSpec, WorkflowHandle
from workflow_engine._logs import configure_logging

STARTERS = 20  # concurrent starts


class GcPauses:
    """The garbage collector's full collections and how long each stopped everything."""

    def __init__(self) -> None:
        self.full: list[float] = []
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.full.append((time.perf_counter() - self._started) * 1000)


def progress(message: str) -> None:
    print(f"    {message}", file=sys.stderr, flush=True)


async def node_gaps_ms(probe: WorkflowHandle) -> list[float]:
    """The time between the probe's consecutive node events, in milliseconds."""
    times = [
        e.created_at async for e in probe.events(kinds=frozenset({"node"})) if e.kind == "node"
    ]
    return [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(times)]


async def run(
    server: str, workflows: int, job_seconds: float, probes: int, wait: bool
) -> dict[str, Any]:
    db = f"inflight_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(server, autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {db}")
    spec = TaskSpec(
        steps=tuple(Step(id=f"s{i}", command=("sleep", str(job_seconds))) for i in range(STEPS))
    )
    probe_spec = engine_task()
    with tempfile.TemporaryDirectory() as tmp:
        settings = engine_settings(make_conninfo(server, dbname=db), Path(tmp), 20)
        engine = await Engine(
            settings.with_overrides(
                lease_ttl_seconds=max(120, 3 * job_seconds),
                max_running_jobs=workflows + probes,
            )
        ).open()
        rss_idle = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        pauses = GcPauses()
        ids = [str(uuid.uuid4()) for _ in range(workflows)]
        t0 = time.perf_counter()
        queue = iter(ids)
        started = 0

        async def starter() -> None:  # an orchestrator starts many at once, too
            nonlocal started
            for task_id in queue:
                await engine.start(spec, task_id=task_id)
                started += 1
                if started % 2000 == 0:
                    progress(f"{started} of {workflows} started")

        await asyncio.gather(*(starter() for _ in range(STARTERS)))
        started_s = time.perf_counter() - t0
        gaps: list[float] = []
        full_before_probes = len(pauses.full)
        for _ in range(probes):
            probe = await engine.start(probe_spec)
            async with asyncio.timeout(60):
                await probe.wait()
            gaps += await node_gaps_ms(probe)
        probed_s = time.perf_counter() - t0
        probe_gcs = pauses.full[full_before_probes:]
        if wait:
            for task_id in ids:
                async with asyncio.timeout(600):
                    await engine.workflow(task_id).wait()
        elapsed = time.perf_counter() - t0
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        await engine.close(drain_timeout=0 if not wait else None)
    async with await psycopg.AsyncConnection.connect(server, autocommit=True) as admin:
        await admin.execute(f"DROP DATABASE {db} WITH (FORCE)")
    result: dict[str, Any] = {
        "workflows_in_flight": workflows,
        "job_seconds": job_seconds,
        "start_all_s": round(started_s, 2),
        "all_in_flight_during_probes": probed_s < job_seconds,
        "peak_rss_mb": round(peak_rss / 1024, 1),
        "peak_rss_at_engine_start_mb": round(rss_idle / 1024, 1),
    }
    if gaps:
        cuts = statistics.quantiles(gaps, n=100) if len(gaps) > 1 else gaps * 99
        result |= {
            "probe_node_gaps": len(gaps),
            "probe_node_p50_ms": round(cuts[49], 1),
            "probe_node_p99_ms": round(cuts[98], 1),
            "probe_node_max_ms": round(max(gaps), 1),
            "full_gc_during_probes_ms": [round(ms) for ms in probe_gcs],
        }
    result["full_gc_count"] = len(pauses.full)
    result["full_gc_max_ms"] = round(max(pauses.full, default=0), 1)
    if wait:
        jobs = workflows * STEPS
        result |= {
            "elapsed_s": round(elapsed, 2),
            "jobs_per_s": round(jobs / elapsed, 1),
            "ideal_jobs_per_s": workflows / job_seconds,
            "share_of_ideal": round(jobs / elapsed / (workflows / job_seconds), 3),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--job-seconds", type=float, default=0.2)
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument(
        "--no-wait", action="store_true", help="close once probed; no throughput figures"
    )
    args = parser.parse_args()
    configure_logging("warning")
    result = run_on_bench_postgres(
        lambda url: run(url, args.workflows, args.job_seconds, args.probes, not args.no_wait)
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
