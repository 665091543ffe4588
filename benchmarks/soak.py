"""Run for months: does memory come back after every workflow? (issue 62)

Rounds of `--workflows` three-step workflows, `--concurrency` at a time, every one run to its
end; after each round a pause (`--pause`: long enough for per-task helpers to go idle), then
the resident memory of each engine process. Two contenders, one after the other:

- **served**: `workflow-engine serve`, 2 engine processes, real `true` through the default
  worker (the local sandbox), driven over gRPC (start, then watch to the end);
- **in-process**: `Engine` with the simulated worker (its memory is this process's).

The slope is the least-squares line of memory over workflows run, from the third round on
(the first two fill what is allocated once: pools, caches up to their bounds, the allocator's
arenas), in KB per workflow: per engine process, and for the engine processes together. The
target is under 0.1 KB per workflow: flat within noise. The in-process contender also prints
what its census (`Engine.held`) counts at the end.

    .venv/bin/python benchmarks/soak.py [--rounds 10] [--workflows 1500] [--concurrency 20]
        [--pause 35] [--only served|in-process]

Prints a table per contender and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_postgres import run_on_bench_postgres
from contenders import EngineGrpcCommandProcesses, EngineInProcess, engine_processes

from workflow_engine._logs import configure_logging

KB = 1024


async def run_round(contender: Any, workflows: int, concurrency: int, first: int) -> float:
    """Run `workflows` to their end, `concurrency` at a time; the seconds it took."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            await contender.run(i)

    started = time.perf_counter()
    await asyncio.gather(*(one(first + i) for i in range(workflows)))
    return time.perf_counter() - started


def resident(contender: Any) -> list[int]:
    """Resident bytes of each engine process (this one for the in-process contender)."""
    if isinstance(contender, EngineInProcess):
        gc.collect()
        return [psutil.Process().memory_info().rss]
    processes = engine_processes(contender.address, contender.server_pid())
    return [p.memory_info().rss for p in sorted(processes, key=lambda p: p.pid)]


def slope_kb(done: list[int], memory: list[int]) -> float | None:
    """KB per workflow of the least-squares line through (workflows done, bytes)."""
    if len(done) < 2:
        return None
    return statistics.linear_regression(done, memory).slope / KB


async def soak(contender: Any, url: str, args: argparse.Namespace) -> dict[str, Any]:
    await contender.open(url, args.concurrency)
    rounds: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            seconds = await run_round(
                contender, args.workflows, args.concurrency, r * args.workflows
            )
            await asyncio.sleep(args.pause)
            memory = resident(contender)
            rounds.append(
                {
                    "workflows": (r + 1) * args.workflows,
                    "seconds": round(seconds, 1),
                    "rss_mb": [round(m / KB / KB, 1) for m in memory],
                    "bytes": memory,
                }
            )
            print(
                f"  round {r + 1}: {args.workflows} workflows in {seconds:.1f} s, resident MB "
                f"{', '.join(f'{m / KB / KB:.1f}' for m in memory)}",
                flush=True,
            )
        held = (
            [h for h in contender.engine.held() if h.entries]
            if isinstance(contender, EngineInProcess)
            else []
        )
    finally:
        await contender.close()
    tail = rounds[2:] if len(rounds) > 3 else rounds
    done = [r["workflows"] for r in tail]
    per_process = [
        slope_kb(done, [r["bytes"][i] for r in tail])
        for i in range(min(len(r["bytes"]) for r in tail))
    ]
    together = slope_kb(done, [sum(r["bytes"]) for r in tail])
    for r in rounds:
        del r["bytes"]
    return {
        "contender": contender.name,
        "rounds": rounds,
        "slope_kb_per_workflow": None if together is None else round(together, 3),
        "slope_kb_per_workflow_per_process": [
            None if s is None else round(s, 3) for s in per_process
        ],
        "held_at_end": {h.structure: [h.entries, h.bound] for h in held},
    }


async def main(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        contenders = {
            "served": EngineGrpcCommandProcesses(Path(tmp) / "served"),
            "in-process": EngineInProcess(Path(tmp) / "in-process"),
        }
        for name, contender in contenders.items():
            if args.only and name != args.only:
                continue
            print(f"{contender.name}:", flush=True)
            result = await soak(contender, url, args)
            print(
                f"  slope after round 2: {result['slope_kb_per_workflow']} KB/workflow "
                f"(per process {result['slope_kb_per_workflow_per_process']}); "
                f"held at the end: {result['held_at_end'] or 'nothing'}",
                flush=True,
            )
            results.append(result)
    return results


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workflows", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--pause", type=float, default=35.0)
    parser.add_argument("--only", choices=["served", "in-process"])
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    configure_logging("warning")
    outcome = run_on_bench_postgres(lambda url: main(url, arguments))
    print(json.dumps({"soak": outcome, "settings": vars(arguments)}))
