"""Retention end to end: thousands of finished and unfinished workflows in the tables, an engine
pruning them in the background while it runs workflows, and `workflow-engine prune` as an
operator runs it.

Shown: exactly what was due went (counted, and by the metric), nothing unfinished, recent, held
or not the engine's lost a row or an event, every checkpoint row stayed, a pruned workflow's
watch still ends with its final status, and the workflows that ran meanwhile all finished with
every event in place.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from prometheus_client import CollectorRegistry

from tests.support import database
from tests.support.engine_process import ENGINE
from tests.support.retention_rows import Kind, fill, snapshot
from workflow_engine.config import RetentionSettings, Settings
from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.domain.task import TaskSpec
from workflow_engine.engine import Engine

pytestmark = pytest.mark.e2e

EVENTS = 6
#: Due (old, finished, the engine's, nobody's lease) and not due, by name.
DUE = {
    "succeeded": Kind("SUCCEEDED", 45, 1500, EVENTS),
    "failed": Kind("FAILED", 31, 700, EVENTS),
    "cancelled": Kind("CANCELLED", 400, 300, EVENTS, lease="none"),
}
NOT_DUE = {
    "recent": Kind("SUCCEEDED", 29, 1000, EVENTS),
    "running": Kind("RUNNING", 60, 800, EVENTS),
    "waiting": Kind("WAITING_FOR_APPROVAL", 60, 300, EVENTS),
    "suspended": Kind("SUSPENDED", 60, 200, EVENTS),
    "held": Kind("SUCCEEDED", 60, 100, EVENTS, lease="held"),
    "foreign": Kind("SUCCEEDED", 60, 300, EVENTS, owned=False),
}


def _task(steps: int, seconds: float) -> TaskSpec:
    return TaskSpec.from_json(
        {"steps": [{"id": f"s{i}", "command": ["sleep", str(seconds)]} for i in range(steps)]}
    )


async def _fill(db_url: str, kinds: dict[str, Kind]) -> dict[str, list[str]]:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        return {name: await fill(conn, kind) for name, kind in kinds.items()}


async def test_retention_prunes_what_is_due_while_workflows_run(settings: Settings) -> None:
    due_rows, kept_rows = (
        await _fill(settings.database_url, DUE),
        await _fill(settings.database_url, NOT_DUE),
    )
    kept = [t for ids in kept_rows.values() for t in ids]
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        before = await snapshot(conn, kept)
    settings = replace(
        settings,
        worker="simulated",
        retention=RetentionSettings(days=30, batch_size=20, interval_seconds=0.3),
    )
    engine = Engine(settings)
    registry = engine.context.metrics.enable()
    async with engine:
        # Workflows that ran here and finished long ago (as far as their rows say).
        finished = [(await engine.run(_task(2, 0))).task_id for _ in range(10)]
        async with engine.pool.connection() as conn:
            await conn.execute(
                "UPDATE workflow_checkpoints SET updated_at = now() - interval '60 days'"
                " WHERE task_id = ANY(%s::uuid[])",
                (finished,),
            )
        # Workflows running while the pruner works through the due ones: long enough (8 steps
        # of 0.3 s) for more than one of its rounds, behind a pooler on a loaded machine too
        # (4 steps left it one round there once: 40 pruned at the start and at the end).
        handles = [await engine.start(_task(8, 0.3)) for _ in range(30)]
        pruned_at_start = _pruned(registry)
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 120)
        assert {r.status for r in results} == {WorkflowStatus.SUCCEEDED}
        due = [t for ids in due_rows.values() for t in ids] + finished
        # The pruner was at work while they ran: not done when they started, on since.
        assert pruned_at_start < len(due) and _pruned(registry) > pruned_at_start
        pruned = await _wait_for_pruned(registry, len(due))
        # A pruned workflow's watch still ends, with its final status.
        events = [e async for e in engine.workflow(due_rows["failed"][0]).events()]
        assert [(e.kind, e.status) for e in events] == [("status", "FAILED")]
        async with engine.pool.connection() as conn:
            assert await snapshot(conn, kept) == before
            after = await snapshot(conn, due)
            assert after.events == dict.fromkeys(due, 1)
            assert (after.tasks, after.checkpoints) == (0, len(due))
            ran = [h.task_id for h in handles]
            cur = await conn.execute(
                "SELECT c.event_seq, count(e.seq), min(e.seq), max(e.seq), count(t.task_id)"
                "  FROM workflow_checkpoints c JOIN workflow_events e USING (task_id)"
                "  LEFT JOIN workflow_tasks t USING (task_id)"
                " WHERE c.task_id = ANY(%s::uuid[]) GROUP BY c.task_id, c.event_seq",
                (ran,),
            )
            for seq, count, first, last, tasks in await cur.fetchall():
                assert (count, first, last) == (seq, 1, seq)
                assert tasks == count  # the task row is there, once per event row joined
            cur = await conn.execute(
                "SELECT sum(event_seq) FROM workflow_checkpoints WHERE task_id = ANY(%s::uuid[])",
                (finished,),
            )
            (finished_events,) = await cur.fetchone() or (0,)
    bulk = len(due) - len(finished)
    assert pruned == len(due)
    assert _sample(registry, "workflow_events") == bulk * (EVENTS - 1) + finished_events - len(
        finished
    )
    assert _sample(registry, "workflow_tasks") == len(due)


def _pruned(registry: CollectorRegistry) -> int:
    """The pruned workflows the metric counts so far."""
    value = registry.get_sample_value("workflow_engine_retention_pruned_workflows_total")
    return int(value or 0)


async def _wait_for_pruned(registry: CollectorRegistry, count: int) -> int:
    """The pruned workflows counted by the metric, once they reach `count` (or 90 s pass)."""
    for _ in range(900):
        if _pruned(registry) >= count:
            break
        await asyncio.sleep(0.1)
    return _pruned(registry)


def _sample(registry: CollectorRegistry, table: str) -> float:
    value = registry.get_sample_value(
        "workflow_engine_retention_removed_rows_total", {"table": table}
    )
    return float(value or 0)


async def _prune(*args: str, db_url: str, **env: str) -> tuple[int, str, str]:
    environ = {**os.environ, "WORKFLOW_ENGINE_DATABASE_URL": db_url, **env}
    environ.update(database.engine_env(db_url))
    proc = await asyncio.create_subprocess_exec(
        str(ENGINE),
        "prune",
        *args,
        env=environ,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


def _counts(out: str) -> dict[str, int]:
    lines = out.strip().splitlines()
    return {
        line.split(":")[0]: int(line.split(":")[1].split()[0]) for line in lines[1:] if ":" in line
    }


async def test_the_prune_command(db_url: str, tmp_path: Path) -> None:
    due_rows, kept_rows = await _fill(db_url, DUE), await _fill(db_url, NOT_DUE)
    due = [t for ids in due_rows.values() for t in ids]
    every = due + [t for ids in kept_rows.values() for t in ids]
    kept = [t for ids in kept_rows.values() for t in ids]
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        before, kept_before = await snapshot(conn, every), await snapshot(conn, kept)

    code, out, err = await _prune("--older-than", "30", "--dry-run", db_url=db_url)
    assert code == 0, err
    assert out.startswith(f"would prune {len(due)} finished workflow(s)"), out
    assert "nothing was changed" in out
    expected = {
        "workflow_events": len(due) * (EVENTS - 1),
        "workflow_tasks": len(due),
        "workflow_checkpoints": 0,
        "task_workflow_leases": 0,
    }
    assert _counts(out) == expected
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        assert await snapshot(conn, every) == before

    code, out, err = await _prune("--older-than", "30", db_url=db_url)
    assert code == 0, err
    assert out.startswith(f"pruned {len(due)} finished workflow(s)"), out
    assert _counts(out) == expected
    code, out, err = await _prune("--older-than", "30", db_url=db_url)
    assert out.startswith("pruned 0 finished"), out

    # Rows too: every finished one of the engine's older than 30 days, with its last event.
    code, out, err = await _prune(
        "--older-than", "30", db_url=db_url, WORKFLOW_ENGINE_RETENTION_DELETE_ROWS="true"
    )
    assert code == 0, err
    with_lease = len(due) - len(due_rows["cancelled"])
    assert _counts(out) == {
        "workflow_events": len(due),
        "workflow_tasks": 0,
        "workflow_checkpoints": len(due),
        "task_workflow_leases": with_lease,
    }
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        assert await snapshot(conn, kept) == kept_before
        gone = await snapshot(conn, due)
        assert (gone.events, gone.tasks, gone.checkpoints, gone.leases) == ({}, 0, 0, 0)

    for bad in ("-1", "nan", "1e300"):  # 1e300 days: past PostgreSQL's intervals
        code, _, err = await _prune("--older-than", bad, db_url=db_url)
        assert code == 2 and "--older-than" in err, err
    code, _, err = await _prune(db_url=db_url)
    assert code == 2 and "--older-than" in err, err
