"""`make bench-pooler`: the engine behind a transaction-mode PgBouncer, against a direct connection.

For each way of reaching PostgreSQL, the same workflows (3 steps of `sleep 0.05` through the
simulated worker, 5 at a time) run in-process while a watcher follows each one; a watch event's
delay is the time from its row's commit time (`created_at`, on the same machine's clock) to the
watcher receiving it. Prints a table and a JSON line, writes bench-results/pooler.json and a plot
of the delays, bench-results/pooler.png.

    .venv/bin/python benchmarks/pooler.py [--workflows 40]

Routes: direct (pool and listener straight to PostgreSQL, prepared statements on, as `make run`);
pooled + listen URL (pool through PgBouncer with `DATABASE_PREPARE=off`, listener direct: what
docs/operations.md recommends); pooled + none (no notifications: watchers poll every second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench_postgres import run_on_bench_postgres  # noqa: E402  (this script's own directory)

from tests.support.pgbouncer import PgBouncer  # noqa: E402  (the same runner the tests use)
from workflow_engine import Engine, Settings, Step, TaskSpec  # noqa: E402
from workflow_engine._logs import configure_logging  # noqa: E402

OUT = ROOT / "bench-results"
TASK = TaskSpec(
    prompt="pooler bench",
    steps=tuple(Step(id=f"s{i}", command=("sleep", "0.05")) for i in range(3)),
)
AT_ONCE = 5


async def run_route(name: str, settings: Settings, workflows: int) -> dict[str, Any]:
    engine = await Engine(settings).open()
    delays: list[float] = []

    async def one() -> None:
        workflow = await engine.start(TASK)
        async for event in workflow.events():
            delays.append((datetime.now(UTC) - event.created_at).total_seconds() * 1000)

    started = time.perf_counter()
    try:
        for first in range(0, workflows, AT_ONCE):
            await asyncio.gather(*(one() for _ in range(min(AT_ONCE, workflows - first))))
    finally:
        elapsed = time.perf_counter() - started
        await engine.close()
    delays.sort()
    return {
        "route": name,
        "workflows": workflows,
        "workflows_per_s": round(workflows / elapsed, 1),
        "events": len(delays),
        "delay_p50_ms": round(statistics.median(delays), 1),
        "delay_p95_ms": round(delays[int(len(delays) * 0.95) - 1], 1),
        "delay_max_ms": round(delays[-1], 1),
        "_delays": delays,
    }


async def fresh_database(admin_url: str) -> str:
    name = f"pool_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {name}")
    return name


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.boxplot([r["_delays"] for r in results], showfliers=True)
    ax.set_xticks(range(1, len(results) + 1), [r["route"] for r in results])
    ax.set_yscale("log")
    ax.set_ylabel("watch event delay (ms, log scale)")
    ax.set_title("Watch delay per event: direct vs transaction-mode PgBouncer")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def main_async(url: str, workflows: int) -> list[dict[str, Any]]:
    bouncer = PgBouncer(url, ROOT / ".data" / "bench-pgbouncer")
    try:
        results = []
        base = dict(
            listen="127.0.0.1:0",
            worker="simulated",
            recovery_enabled=False,
            log_level="warning",
            lease_ttl_seconds=60,
        )
        routes = [
            ("direct", lambda db: {"database_url": make_conninfo(url, dbname=db)}),
            (
                "pooled + listen URL",
                lambda db: {
                    "database_url": bouncer.url(db),
                    "database_prepare": "off",
                    "listen_database_url": make_conninfo(url, dbname=db),
                },
            ),
            (
                "pooled + none",
                lambda db: {
                    "database_url": bouncer.url(db),
                    "database_prepare": "off",
                    "listen_database_url": "none",
                },
            ),
        ]
        for name, route in routes:
            db = await fresh_database(url)
            print(f"  {name} ...", file=sys.stderr, flush=True)
            settings = Settings(
                **base,  # type: ignore[arg-type]
                **route(db),
                data_dir=ROOT / ".data" / "bench-pooler",
            )
            results.append(await run_route(name, settings, workflows))
        return results
    finally:
        bouncer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=40)
    args = parser.parse_args()
    configure_logging("warning")
    results = run_on_bench_postgres(lambda url: main_async(url, args.workflows))
    columns = [k for k in results[0] if not k.startswith("_")]
    print("  ".join(f"{c:>20}" for c in columns))
    for r in results:
        print("  ".join(f"{r[c]!s:>20}" for c in columns))
    clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in results]
    print(json.dumps({"pooler": clean}))
    OUT.mkdir(exist_ok=True)
    (OUT / "pooler.json").write_text(json.dumps(clean, indent=2))
    plot(results, OUT / "pooler.png")
    print(f"wrote {OUT / 'pooler.json'} and {OUT / 'pooler.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()
