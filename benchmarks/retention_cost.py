"""What retention costs the workflows that run meanwhile: a checkpoint write's latency while the
pruner works through thousands of due workflows, against the same with the pruner idle.

On the embedded PostgreSQL: `--writers` runs each hold a lease and write their node checkpoint
again and again through the engine's own group commit (`WRITE_BATCH`, the statement every
node ends with). Rounds alternate: before each, `--due` finished workflows (`--events` events
each, a year old) are added by SQL; a busy round measures the writes while the pruner prunes
them (batches of `--batch`, as in the background; at most `--seconds`), an idle round measures
the writes as long as the busy round before it took, with the pruner off, and prunes them
afterwards, unmeasured.

    .venv/bin/python benchmarks/retention_cost.py [--rounds 3] [--due 5000]

Prints p50 and p99 of a write for each, their ratio, and one JSON line. A figure, not a test:
this machine's other work moves it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

import psycopg
from bench_postgres import run_on_bench_postgres
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from workflow_engine._logs import configure_logging
from workflow_engine.runtime._retention import prune_all
from workflow_engine.storage._database import run_migrations
from workflow_engine.storage._group_commit import CheckpointRow, GroupCommitter
from workflow_engine.storage.workflow_rows import create

HOLDER = "bench"

# Finished workflows a year old, with their events, task and released lease (as the engine
# leaves them).
_FILL = """
WITH rows AS (
    INSERT INTO workflow_checkpoints (task_id, state, status, event_seq, engine_owned, run_id,
                                      updated_at)
    SELECT gen_random_uuid(), '{}'::jsonb, 'SUCCEEDED', %(events)s, true, gen_random_uuid(),
           now() - interval '1 year'
      FROM generate_series(1, %(count)s)
    RETURNING task_id, run_id
), events AS (
    INSERT INTO workflow_events (task_id, seq, run_id, kind, status)
    SELECT task_id, s, run_id, 'status', 'SUCCEEDED'
      FROM rows CROSS JOIN generate_series(1, %(events)s) s
), tasks AS (
    INSERT INTO workflow_tasks (task_id, spec) SELECT task_id, '{}'::jsonb FROM rows
)
INSERT INTO task_workflow_leases (task_id, lease_id, engine_lease_id)
SELECT task_id, l, l FROM rows, gen_random_uuid() l
"""


class Writers:
    """`count` runs, each writing its checkpoint in a loop while `running`; their latencies."""

    def __init__(self, pool: Any, count: int) -> None:
        self.pool = pool
        self.count = count
        self.committer = GroupCommitter(pool)
        self.fences: list[tuple[str, str, int]] = []
        self.latencies: list[float] = []

    async def start(self) -> None:
        for _ in range(self.count):
            task_id = str(uuid.uuid4())
            run_id = str(uuid.uuid4())
            started = await create(
                self.pool,
                task_id=task_id,
                run_id=run_id,
                holder_id=HOLDER,
                process=HOLDER,
                idempotency_key=None,
                ttl_seconds=3600,
                spec={},
                initial_state={"task_id": task_id, "run_id": run_id},
            )
            assert started.lease is not None
            self.fences.append((task_id, started.run_id, started.lease.epoch))

    async def measure(
        self, seconds: float, until: asyncio.Future[Any] | None = None
    ) -> list[float]:
        """Write for `seconds`, or until `until` is done; each write's latency."""
        self.latencies = []
        deadline = time.perf_counter() + seconds
        await asyncio.gather(*(self._write(fence, deadline, until) for fence in self.fences))
        return self.latencies

    async def _write(
        self, fence: tuple[str, str, int], deadline: float, until: asyncio.Future[Any] | None
    ) -> None:
        task_id, run_id, epoch = fence
        state = {"task_id": task_id, "plan": [{"id": f"s{i}"} for i in range(5)]}
        while time.perf_counter() < deadline and not (until is not None and until.done()):
            row = CheckpointRow(
                task_id, HOLDER, epoch, run_id, state, "dispatch_step", "RUNNING",
                str(uuid.uuid4()), {"v": 1}, {}, "", "",
            )  # fmt: skip
            t0 = time.perf_counter()
            outcome = await self.committer.write(row)
            self.latencies.append(time.perf_counter() - t0)
            assert outcome.written == "written", outcome


async def _prune(pool: Any, batch: int) -> tuple[int, float]:
    """Workflows pruned, and the seconds the round took."""
    t0 = time.perf_counter()
    pruned = await prune_all(
        pool.connection, older_than_seconds=86400, delete_rows=False, batch_size=batch
    )
    return (pruned.workflows if pruned else 0), time.perf_counter() - t0


def _percentiles(latencies: list[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    return statistics.median(ordered) * 1000, ordered[int(0.99 * (len(ordered) - 1))] * 1000


async def run(server_url: str, args: argparse.Namespace) -> dict[str, object]:
    db = f"bench_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {db}")
    url = make_conninfo(server_url, dbname=db)
    busy: list[float] = []
    idle: list[float] = []
    pruned_per_second: list[float] = []
    try:
        async with AsyncConnectionPool(url, kwargs={"autocommit": True}, max_size=8) as pool:
            await run_migrations(pool)
            writers = Writers(pool, args.writers)
            await writers.start()
            await writers.measure(0.5)  # warm-up
            for i in range(args.rounds):
                async with pool.connection() as conn:
                    await conn.execute(_FILL, {"count": args.due, "events": args.events})
                    await conn.execute("ANALYZE")
                t0 = time.perf_counter()
                pruning = asyncio.create_task(_prune(pool, args.batch))
                busy += await writers.measure(args.seconds, until=pruning)
                took = time.perf_counter() - t0  # the writers' window (at most --seconds)
                count, pruning_took = await pruning
                pruned_per_second.append(count / pruning_took)
                async with pool.connection() as conn:
                    await conn.execute(_FILL, {"count": args.due, "events": args.events})
                    await conn.execute("ANALYZE")
                idle += await writers.measure(took)
                await _prune(pool, args.batch)
                print(
                    f"round {i + 1}/{args.rounds}: pruned {count} in {pruning_took:.1f} s",
                    flush=True,
                )
            await writers.committer.close()
    finally:
        async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as admin:
            await admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    (idle50, idle99), (busy50, busy99) = _percentiles(idle), _percentiles(busy)
    return {
        "writers": args.writers,
        "due_per_round": args.due,
        "events_each": args.events,
        "writes_idle": len(idle),
        "writes_pruning": len(busy),
        "write_p50_ms_idle": round(idle50, 2),
        "write_p50_ms_pruning": round(busy50, 2),
        "write_p99_ms_idle": round(idle99, 2),
        "write_p99_ms_pruning": round(busy99, 2),
        "p50_ratio": round(busy50 / idle50, 2),
        "p99_ratio": round(busy99 / idle99, 2),
        "pruned_workflows_per_s": round(statistics.median(pruned_per_second)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--due", type=int, default=5000, help="due workflows added per round")
    parser.add_argument("--events", type=int, default=10, help="events of each")
    parser.add_argument("--writers", type=int, default=8, help="runs writing at once")
    parser.add_argument("--seconds", type=float, default=10.0, help="longest round")
    parser.add_argument("--batch", type=int, default=200, help="workflows per prune batch")
    args = parser.parse_args()
    configure_logging("warning")
    result = run_on_bench_postgres(lambda url: run(url, args))
    print(f"{'figure':<32} value")
    for key, value in result.items():
        print(f"{key:<32} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
