"""Growth with the workflow's length (issue 64, item 7): does a step cost the same at step 500
as at step 10?

One workflow at a time, a sequential plan of N steps, each step's command printing about
`--output-bytes` (default 60 KB: ``head -c K /dev/urandom | base64 -w 0``). Two contenders,
each on its own fresh database of the benchmarks' embedded PostgreSQL:

- **engine**: `Engine` in-process, the default worker (the local sandbox: real commands
  through jobwrap);
- **peer**: what a LangGraph user would write: a StateGraph whose one node runs the command
  (an asyncio subprocess) and appends its stdout to a `results` channel (a list with an
  `operator.add` reducer), looping N times, `AsyncPostgresSaver` with durability "sync".

Per workflow: wall, this process's CPU (the engine's or LangGraph's; the jobs and PostgreSQL
are other processes), WAL written (`pg_current_wal_lsn()` before and after), and what is
stored: the engine's row (`pg_column_size` of its state and checkpoint), the peer's checkpoint
tables' growth. Then per step, the ratios against the smallest size, and issue 64's targets,
met or not:

- per-step wall and WAL at 100 steps within 1.5x and 2x of those at 10 steps; at 500 steps
  within 2x and 3x;
- a 500-step workflow with 60 KB outputs writes at most twice the outputs' own size in WAL,
  plus a constant per node (the WAL per node of a run whose steps print nothing, `true`).

On today's engine a step's WAL grows with the steps before it, so a size costs about
(N / previous N)^2 times the previous one: a size whose quadratic extrapolation passes
`--max-seconds` or `--max-wal-gb` is skipped, saying what it would have cost. 500 steps is
not in the default sizes (on the order of 30 minutes and 30 GB of WAL); the output says so,
with the extrapolation. Measure it with

    .venv/bin/python benchmarks/growth.py --steps 10,100,500 --max-seconds 7200 --max-wal-gb 60

    .venv/bin/python benchmarks/growth.py [--steps 10,100] [--output-bytes 61440]
        [--max-seconds 900] [--max-wal-gb 8] [--only engine|peer]

Prints a table, the targets, one JSON line; writes bench-results/growth.json.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import operator
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_postgres import run_on_bench_postgres
from contenders import engine_settings
from langgraph.graph import END, START, StateGraph

from workflow_engine import Engine, Step, TaskSpec
from workflow_engine._logs import configure_logging
from workflow_engine.config import JobSettings

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench-results"
MB = 1024 * 1024
GB = 1024 * MB
ISSUE_SIZES = (10, 100, 500)
# Issue 64's targets: per-step wall and WAL at N steps against those at 10 steps.
RATIO_TARGETS = {100: (1.5, 2.0), 500: (2.0, 3.0)}
WAL_OUTPUTS_FACTOR = 2  # WAL at most twice the outputs' own size, plus a constant per node
PEER_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


def command(output_bytes: int) -> tuple[str, ...]:
    """A command printing about `output_bytes` of base64 (none: `true`)."""
    if output_bytes <= 0:
        return ("true",)
    return ("sh", "-c", f"head -c {output_bytes * 3 // 4} /dev/urandom | base64 -w 0")


async def wal_lsn(conn: psycopg.AsyncConnection[Any]) -> str:
    row = await (await conn.execute("SELECT pg_current_wal_lsn()::text")).fetchone()
    assert row is not None
    return str(row[0])


async def wal_since(conn: psycopg.AsyncConnection[Any], lsn: str) -> int:
    query = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)::bigint"
    row = await (await conn.execute(query, (lsn,))).fetchone()
    assert row is not None
    return int(row[0])


async def measured(
    conn: psycopg.AsyncConnection[Any], run: Callable[[], Awaitable[None]]
) -> dict[str, float]:
    """Wall, this process's CPU and the cluster's WAL around `run()`."""
    await conn.execute("CHECKPOINT")  # full-page writes after it: each run starts the same
    lsn = await wal_lsn(conn)
    cpu, wall = time.process_time(), time.perf_counter()
    await run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"wall_s": wall, "cpu_s": cpu, "wal_bytes": await wal_since(conn, lsn)}


class EngineContender:
    name = "engine"

    def __init__(self, url: str, data_dir: Path, output_bytes: int) -> None:
        settings = engine_settings(url, data_dir, 1, "sandbox")
        # A result keeps the whole output (60 KB is within the default 64 KiB).
        job = JobSettings(output_bytes=max(settings.job.output_bytes, output_bytes + 1024))
        self.settings = dataclasses.replace(settings, job=job)
        self.url = url

    async def open(self) -> None:
        self.engine = await Engine(self.settings).open()

    async def close(self) -> None:
        await self.engine.close()

    async def run(
        self, conn: psycopg.AsyncConnection[Any], steps: int, output_bytes: int
    ) -> dict[str, float]:
        argv = command(output_bytes)
        task = TaskSpec(steps=tuple(Step(id=f"s{i}", command=argv) for i in range(steps)))
        task_id = str(uuid.uuid4())

        async def one() -> None:
            workflow = await self.engine.start(task, task_id=task_id)
            result = await workflow.result()
            assert result.status == "SUCCEEDED", (result.status, result.error)

        figures = await measured(conn, one)
        query = """
            SELECT pg_column_size(c.state)::bigint + coalesce(pg_column_size(c.checkpoint), 0),
                   (SELECT count(*) FROM workflow_events e
                     WHERE e.task_id = c.task_id AND e.kind = 'node')
              FROM workflow_checkpoints c WHERE c.task_id = %s"""
        row = await (await conn.execute(query, (task_id,))).fetchone()
        assert row is not None
        return {**figures, "stored_bytes": int(row[0]), "nodes": int(row[1])}


class PeerState(TypedDict, total=False):
    step: int
    results: Annotated[list[str], operator.add]


class LangGraphPeer:
    """What a LangGraph user would write: every step's stdout kept in the state."""

    name = "peer: langgraph+AsyncPostgresSaver, results channel"

    def __init__(self, url: str, data_dir: Path, output_bytes: int) -> None:
        self.url = url

    async def open(self) -> None:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        self.pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            self.url,
            min_size=1,
            max_size=2,
            open=False,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        )
        await self.pool.open(wait=True)
        self.saver = AsyncPostgresSaver(self.pool)  # type: ignore[arg-type]
        await self.saver.setup()

    async def close(self) -> None:
        await self.pool.close()

    def graph(self, steps: int, argv: tuple[str, ...]) -> Any:
        async def run_step(state: PeerState) -> PeerState:
            process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
            stdout, _ = await process.communicate()
            assert process.returncode == 0
            return {"step": state.get("step", 0) + 1, "results": [stdout.decode()]}

        graph: StateGraph[Any, Any, Any, Any] = StateGraph(PeerState)
        graph.add_node("run_step", run_step)
        graph.add_edge(START, "run_step")
        graph.add_conditional_edges(
            "run_step", lambda s: END if s["step"] >= steps else "run_step", ["run_step", END]
        )
        return graph.compile(checkpointer=self.saver)

    async def run(
        self, conn: psycopg.AsyncConnection[Any], steps: int, output_bytes: int
    ) -> dict[str, float]:
        graph = self.graph(steps, command(output_bytes))
        thread = str(uuid.uuid4())
        config = {"configurable": {"thread_id": thread}, "recursion_limit": steps + 10}

        async def one() -> None:
            final = await graph.ainvoke({"step": 0, "results": []}, config, durability="sync")
            assert len(final["results"]) == steps

        before = await self.table_bytes(conn)
        figures = await measured(conn, one)
        return {**figures, "stored_bytes": await self.table_bytes(conn) - before, "nodes": steps}

    async def table_bytes(self, conn: psycopg.AsyncConnection[Any]) -> int:
        sizes = " + ".join(f"pg_total_relation_size('{t}')" for t in PEER_TABLES)
        row = await (await conn.execute(f"SELECT {sizes}")).fetchone()
        assert row is not None
        return int(row[0])


def extrapolated(previous: dict[str, Any], steps: int) -> tuple[float, float]:
    """Seconds and WAL bytes at `steps`, quadratic from the run at `previous["steps"]`."""
    scale = (steps / previous["steps"]) ** 2
    return previous["wall_s"] * scale, previous["wal_bytes"] * scale


def per_step(row: dict[str, Any]) -> dict[str, Any]:
    n = row["steps"]
    return {
        **row,
        "wall_ms_per_step": round(row["wall_s"] * 1000 / n, 1),
        "cpu_ms_per_step": round(row["cpu_s"] * 1000 / n, 1),
        "wal_mb_per_step": round(row["wal_bytes"] / MB / n, 3),
        "wall_ms_per_node": round(row["wall_s"] * 1000 / max(row["nodes"], 1), 2),
        "wall_s": round(row["wall_s"], 2),
        "cpu_s": round(row["cpu_s"], 2),
    }


async def sizes_of(
    contender: Any, conn: psycopg.AsyncConnection[Any], args: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Each size's figures (or why it was skipped), and the baseline: `true` at the smallest."""
    rows: list[dict[str, Any]] = []
    await contender.open()
    try:
        baseline = None
        if contender.name == "engine":
            smallest = min(args.steps)
            figures = await contender.run(conn, smallest, 0)
            baseline = per_step({"steps": smallest, **figures})
            baseline["wal_bytes_per_node"] = round(figures["wal_bytes"] / figures["nodes"])
            print(
                f"  baseline, {smallest} steps printing nothing: "
                f"{baseline['wal_bytes_per_node']} B of WAL per node",
                flush=True,
            )
        for steps in args.steps:
            done = [r for r in rows if "wall_s" in r]
            if done:
                seconds, wal = extrapolated(done[-1], steps)
                if seconds > args.max_seconds or wal > args.max_wal_gb * GB:
                    why = (
                        f"skipped: would take ~{seconds:.0f} s / ~{wal / GB:.1f} GB of WAL "
                        f"(quadratic from {done[-1]['steps']} steps; guard "
                        f"--max-seconds {args.max_seconds:g}, --max-wal-gb {args.max_wal_gb:g})"
                    )
                    print(f"  {steps} steps: {why}", flush=True)
                    rows.append({"steps": steps, "skipped": why})
                    continue
            figures = await contender.run(conn, steps, args.output_bytes)
            row = per_step({"steps": steps, **figures})
            rows.append(row)
            print(
                f"  {steps} steps: {row['wall_s']} s, {row['wal_bytes'] / MB:.1f} MB of WAL",
                flush=True,
            )
    finally:
        await contender.close()
    return rows, baseline


def ratios(rows: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Per-step wall, CPU and WAL at each size against the smallest size run."""
    done = [r for r in rows if "wall_s" in r]
    if not done:
        return {}
    base = done[0]
    return {
        r["steps"]: {
            k: round(r[f"{k}_per_step"] / base[f"{k}_per_step"], 2)
            if base[f"{k}_per_step"]
            else math.nan
            for k in ("wall_ms", "cpu_ms", "wal_mb")
        }
        for r in done
    }


def targets(
    rows: list[dict[str, Any]], baseline: dict[str, Any] | None, output_bytes: int
) -> list[dict[str, Any]]:
    """Issue 64's targets for the engine, each met, not met, or not measured."""
    out: list[dict[str, Any]] = []
    by_steps = {r["steps"]: r for r in rows if "wall_s" in r}
    base = by_steps.get(10)
    for steps, (wall_target, wal_target) in RATIO_TARGETS.items():
        row = by_steps.get(steps)
        for what, key, target in (("wall", "wall_ms", wall_target), ("WAL", "wal_mb", wal_target)):
            name = f"per-step {what} at {steps} steps within {target:g}x of 10 steps"
            if row is None or base is None:
                out.append({"target": name, "ratio": None, "met": None})
                continue
            ratio = round(row[f"{key}_per_step"] / base[f"{key}_per_step"], 2)
            out.append({"target": name, "ratio": ratio, "met": ratio <= target})
    per_node = baseline["wal_bytes_per_node"] if baseline else None
    for steps in sorted(set(by_steps) | {500}):
        row = by_steps.get(steps)
        name = (
            f"WAL at {steps} steps at most {WAL_OUTPUTS_FACTOR}x the outputs "
            f"({steps} x {output_bytes} B) + {per_node} B per node"
        )
        if row is None or per_node is None:
            out.append({"target": name, "ratio": None, "met": None})
            continue
        bound = WAL_OUTPUTS_FACTOR * steps * output_bytes + row["nodes"] * per_node
        ratio = round(row["wal_bytes"] / bound, 2)
        out.append(
            {"target": name, "ratio": ratio, "met": ratio <= 1, "bound_mb": round(bound / MB, 1)}
        )
    return out


def table(results: dict[str, list[dict[str, Any]]]) -> None:
    head = (
        f"{'contender':<52} {'steps':>5} {'nodes':>5} {'wall s':>8} {'ms/step':>8} "
        f"{'CPU ms/step':>11} {'WAL MB':>9} {'WAL MB/step':>11} {'stored MB':>9} {'x1st wall':>9} "
        f"{'x1st WAL':>8}"
    )
    print(head)
    print("-" * len(head))
    for name, rows in results.items():
        rel = ratios(rows)
        for r in rows:
            if "skipped" in r:
                print(f"{name:<52} {r['steps']:>5} {r['skipped']}")
                continue
            x = rel.get(r["steps"], {})
            print(
                f"{name:<52} {r['steps']:>5} {r['nodes']:>5} {r['wall_s']:>8.2f} "
                f"{r['wall_ms_per_step']:>8.1f} {r['cpu_ms_per_step']:>11.1f} "
                f"{r['wal_bytes'] / MB:>9.1f} {r['wal_mb_per_step']:>11.3f} "
                f"{r['stored_bytes'] / MB:>9.2f} {x.get('wall_ms', math.nan):>9.2f} "
                f"{x.get('wal_mb', math.nan):>8.2f}"
            )


async def main(server_url: str, args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, list[dict[str, Any]]] = {}
    baseline: dict[str, Any] | None = None
    for kind in (EngineContender, LangGraphPeer):
        if args.only and not kind.name.startswith(args.only):
            continue
        db = f"growth_{uuid.uuid4().hex[:8]}"
        async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as admin:
            await admin.execute(f"CREATE DATABASE {db}")
        url = make_conninfo(server_url, dbname=db)
        try:
            with tempfile.TemporaryDirectory(prefix="growth-") as tmp:
                contender = kind(url, Path(tmp), args.output_bytes)
                print(f"{contender.name}:", flush=True)
                async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                    rows, base = await sizes_of(contender, conn, args)
                results[contender.name] = rows
                baseline = baseline or base
        finally:
            async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as admin:
                await admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    print()
    table(results)
    engine_rows = results.get("engine", [])
    checked = targets(engine_rows, baseline, args.output_bytes) if "engine" in results else []
    print()
    print("issue 64's targets (engine):")
    for t in checked:
        verdict = {True: "met", False: "NOT MET", None: "not measured"}[t["met"]]
        ratio = "" if t["ratio"] is None else f" (ratio {t['ratio']})"
        print(f"  {t['target']}: {verdict}{ratio}")
    not_run = []
    for name, rows in results.items():
        done = [r for r in rows if "wall_s" in r]
        for steps in ISSUE_SIZES[-1:]:  # 500: the issue's size the default leaves out
            if steps in args.steps or not done:
                continue
            seconds, wal = extrapolated(done[-1], steps)
            line = (
                f"{name}: {steps} steps not run (not in --steps); would take ~{seconds:.0f} s / "
                f"~{wal / GB:.1f} GB of WAL (quadratic from {done[-1]['steps']} steps). "
                f"Measure it with --steps 10,100,500 and the guard raised "
                f"(--max-seconds, --max-wal-gb)."
            )
            print(line)
            not_run.append(line)
    payload = {
        "results": results,
        "ratios_to_smallest": {n: ratios(rows) for n, rows in results.items()},
        "targets": checked,
        "baseline_true": baseline,
        "not_run": not_run,
    }
    return payload


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--steps", type=lambda s: sorted({int(x) for x in s.split(",")}), default=[10, 100]
    )
    parser.add_argument("--output-bytes", type=int, default=61440)
    parser.add_argument("--max-seconds", type=float, default=900.0)
    parser.add_argument("--max-wal-gb", type=float, default=8.0)
    parser.add_argument("--only", choices=["engine", "peer"])
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    configure_logging("warning")
    outcome = run_on_bench_postgres(lambda url: main(url, arguments))
    OUT.mkdir(exist_ok=True)
    (OUT / "growth.json").write_text(json.dumps(outcome, indent=2, default=str))
    print(f"wrote {OUT / 'growth.json'}", file=sys.stderr)
    print(json.dumps({"growth": outcome, "settings": vars(arguments)}, default=str))
