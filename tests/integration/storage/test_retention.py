"""Retention's SQL on a real database: exactly what is due goes, in batches, and nothing else.

Due: the engine's rows (`engine_owned`), finished (SUCCEEDED, FAILED, CANCELLED), last changed
before the cutoff, with nobody holding their lease, in a state format this engine reads.
Pruned: their events but the last status event, and their task; the row is kept (marked) unless
rows are deleted too, and then its lease row goes where the engine took it last.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.support.retention_rows import Kind, fill, snapshot
from workflow_engine.domain.state_format import STATE_FORMAT
from workflow_engine.runtime._retention import DAY_SECONDS, prune_all
from workflow_engine.storage import _retention as retention
from workflow_engine.storage._pool import Pool
from workflow_engine.storage._retention import Pruned, count_due, prune_batch

OLDER_THAN = 30 * DAY_SECONDS
EVENTS = 6


@pytest.fixture
def pool(autocommit_pool: Pool) -> Pool:
    return autocommit_pool


async def _fill_all(pool: Pool) -> dict[str, list[str]]:
    """Every kind of row retention meets, by name; `due*` are the ones it must prune."""
    kinds = {
        "due_succeeded": Kind("SUCCEEDED", 40, 30),
        "due_failed": Kind("FAILED", 31, 20),
        "due_cancelled_no_lease": Kind("CANCELLED", 365, 10, lease="none"),
        "due_theirs_lease": Kind("SUCCEEDED", 40, 5, lease="theirs"),
        "recent": Kind("SUCCEEDED", 29, 20),
        "running_old": Kind("RUNNING", 90, 20),
        "waiting_old": Kind("WAITING_FOR_APPROVAL", 90, 10),
        "suspended_old": Kind("SUSPENDED", 90, 10),
        "held_old": Kind("SUCCEEDED", 90, 10, lease="held"),
        "foreign_old": Kind("SUCCEEDED", 90, 10, owned=False),
        "newer_format_old": Kind("SUCCEEDED", 90, 10, state_format=STATE_FORMAT + 1),
        "due_this_format": Kind("FAILED", 90, 3, state_format=STATE_FORMAT),
    }
    async with pool.connection() as conn:
        return {name: await fill(conn, kind) for name, kind in kinds.items()}


def _due(rows: dict[str, list[str]]) -> list[str]:
    return [t for name, ids in rows.items() if name.startswith("due") for t in ids]


def _kept(rows: dict[str, list[str]]) -> list[str]:
    return [t for name, ids in rows.items() if not name.startswith("due") for t in ids]


async def _prune(pool: Pool, *, delete_rows: bool = False, batch: int = 7) -> Pruned | None:
    return await prune_all(
        pool.connection, older_than_seconds=OLDER_THAN, delete_rows=delete_rows, batch_size=batch
    )


async def test_only_what_is_due_goes_and_the_last_event_stays(pool: Pool) -> None:
    rows = await _fill_all(pool)
    due, kept = _due(rows), _kept(rows)
    async with pool.connection() as conn:
        before = await snapshot(conn, kept)
    pruned = await _prune(pool)
    assert pruned == Pruned(len(due), len(due) * (EVENTS - 1), len(due), 0, 0)
    async with pool.connection() as conn:
        assert await snapshot(conn, kept) == before
        after = await snapshot(conn, due)
        assert after.events == dict.fromkeys(due, 1)
        assert (after.tasks, after.checkpoints, after.leases) == (0, len(due), len(due) - 10)
        cur = await conn.execute(
            "SELECT count(*) FROM workflow_events e JOIN workflow_checkpoints c USING (task_id)"
            " WHERE c.task_id = ANY(%s::uuid[]) AND e.seq = c.event_seq AND e.kind = 'status'"
            " AND e.status = c.status AND c.pruned_seq = c.event_seq",
            (due,),
        )
        assert await cur.fetchone() == (len(due),)
    # Nothing is due any more, and a row that gains events is due again.
    assert await _prune(pool) == Pruned()


async def test_deleting_rows_takes_the_rows_and_the_engines_leases(pool: Pool) -> None:
    rows = await _fill_all(pool)
    await _prune(pool)  # pruned first, rows kept: deleting the rows later still finds them
    due, kept = _due(rows), _kept(rows)
    async with pool.connection() as conn:
        before = await snapshot(conn, kept)
    pruned = await _prune(pool, delete_rows=True, batch=13)
    with_lease = len(due) - len(rows["due_cancelled_no_lease"])
    ours = with_lease - len(rows["due_theirs_lease"])
    assert pruned == Pruned(len(due), len(due), 0, len(due), ours)
    async with pool.connection() as conn:
        assert await snapshot(conn, kept) == before
        after = await snapshot(conn, due)
        assert (after.events, after.tasks, after.checkpoints) == ({}, 0, 0)
        assert after.leases == len(rows["due_theirs_lease"])


async def test_a_dry_run_counts_what_a_round_removes_and_changes_nothing(pool: Pool) -> None:
    rows = await _fill_all(pool)
    every = [t for ids in rows.values() for t in ids]
    for delete_rows in (False, True):
        async with pool.connection() as conn:
            before = await snapshot(conn, every)
            counted = await count_due(conn, older_than_seconds=OLDER_THAN, delete_rows=delete_rows)
            assert await snapshot(conn, every) == before
        assert counted == await _prune(pool, delete_rows=delete_rows)


async def test_one_batch_at_a_time_and_busy_rows_wait(pool: Pool, db_url: str) -> None:
    rows = await _fill_all(pool)
    due = _due(rows)
    busy = rows["due_succeeded"][0]
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as other:
        async with other.transaction():
            await other.execute("SELECT pg_advisory_xact_lock(%s)", (0x77E6_0002,))
            async with pool.connection() as conn:
                assert await _batch(conn) is None  # another batch holds the lock
        async with other.transaction():
            # Someone writes the workflow's rows now (its lease row first, as every writer).
            await other.execute(
                "SELECT 1 FROM task_workflow_leases WHERE task_id = %s FOR UPDATE", (busy,)
            )
            pruned = await _prune(pool)
            assert pruned is not None and pruned.workflows == len(due) - 1
    assert await _prune(pool) == Pruned(1, EVENTS - 1, 1)


async def test_a_row_that_stops_being_due_is_left(pool: Pool, db_url: str) -> None:
    rows = await _fill_all(pool)
    task_id = rows["due_failed"][0]
    other = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    async with other, other.transaction():
        await other.execute(
            "UPDATE workflow_checkpoints SET updated_at = now() WHERE task_id = %s", (task_id,)
        )
        pruned = await _prune(pool)
    assert pruned is not None and pruned.workflows == len(_due(rows)) - 1
    async with pool.connection() as conn:
        assert (await snapshot(conn, [task_id])).events == {task_id: EVENTS}


async def test_the_due_rows_are_found_by_their_index(pool: Pool) -> None:
    await _fill_all(pool)
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("ANALYZE workflow_checkpoints")
        await conn.execute("SET LOCAL enable_seqscan = off")
        for delete_rows in (False, True):
            params = {**retention._params(OLDER_THAN, delete_rows), "limit": 10}
            cur = await conn.execute("EXPLAIN " + retention._CANDIDATES, params)
            plan = "\n".join(row[0] for row in await cur.fetchall())
            assert "workflow_checkpoints_finished_idx" in plan, plan


async def _batch(conn: Any) -> Pruned | None:
    return await prune_batch(conn, older_than_seconds=OLDER_THAN, delete_rows=False, limit=10)
