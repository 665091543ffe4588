"""Retention never touches a row the engine did not write, whatever it looks like.

Another writer's `workflow_checkpoints` row (`engine_owned` false) that says SUCCEEDED and is a
year old, with events, a task and a released lease under its task id (as if the engine had
written them), and the rows the orchestrator's own stub runner leaves: the most eager prune
(everything finished, rows and all) leaves every one of their rows as it was, byte for byte.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.integration.orchestrator import their_code
from tests.support.helpers import new_task_id
from tests.support.retention_rows import Kind, fill
from workflow_engine.runtime._retention import prune_all
from workflow_engine.storage._pool import Pool
from workflow_engine.storage._retention import Pruned, count_due

TABLES = ("workflow_checkpoints", "workflow_events", "workflow_tasks", "task_workflow_leases")


@pytest.fixture
def pool(autocommit_pool: Pool) -> Pool:
    return autocommit_pool


async def _rows(conn: Any, task_ids: list[str]) -> dict[str, list[Any]]:
    """Every row of every table retention writes, for these tasks, as text."""
    found = {}
    for table in TABLES:
        cur = await conn.execute(
            f"SELECT t::text FROM {table} t WHERE task_id = ANY(%s::uuid[]) ORDER BY t::text",
            (task_ids,),
        )
        found[table] = [row[0] for row in await cur.fetchall()]
    return found


async def _theirs(conn: Any) -> list[str]:
    """Another writer's rows: by SQL, looking finished and old, with events under their task
    ids; and the orchestrator's stub runner's, then made to look the same."""
    task_ids = await fill(conn, Kind("SUCCEEDED", 365, 20, owned=False))
    task_ids += await fill(conn, Kind("CANCELLED", 365, 5, owned=False, lease="none"))
    for _ in range(3):
        task_id = new_task_id()
        await their_code.stub_runner(conn, task_id)
        await conn.execute(
            "UPDATE workflow_checkpoints SET status = 'SUCCEEDED',"
            " updated_at = now() - interval '1 year' WHERE task_id = %s",
            (task_id,),
        )
        await conn.execute(
            "INSERT INTO workflow_events (task_id, seq, kind, status)"
            " SELECT %s, s, 'status', 'SUCCEEDED' FROM generate_series(1, 3) s",
            (task_id,),
        )
        task_ids.append(task_id)
    return task_ids


async def test_prune_never_touches_another_writers_rows(pool: Pool, db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        theirs = await _theirs(conn)
        ours = await fill(conn, Kind("SUCCEEDED", 365, 5))  # beside them, due
        before = await _rows(conn, theirs)
        assert all(before[table] for table in TABLES)
        for delete_rows in (False, True):
            counted = await count_due(conn, older_than_seconds=0, delete_rows=delete_rows)
            assert counted.workflows == len(ours)
    for delete_rows in (False, True):
        pruned = await prune_all(
            pool.connection, older_than_seconds=0, delete_rows=delete_rows, batch_size=4
        )
        assert pruned is not None and pruned.workflows == len(ours)
    assert await prune_all(
        pool.connection, older_than_seconds=0, delete_rows=True, batch_size=4
    ) == Pruned(0)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        assert await _rows(conn, theirs) == before
        assert await _rows(conn, ours) == {table: [] for table in TABLES}
