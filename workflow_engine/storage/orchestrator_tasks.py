"""The orchestrator's own ``tasks`` table, read (never written) to start a task by its id.

Their ORM creates the table (see docs/orchestrator.md); the engine's migrations do
not. A row is read whole, as JSON (``to_jsonb``), so the columns of their newer schema
(``deleted_at``, ``planning_state``) arrive when present and nothing breaks when absent;
`capabilities.tasks._table` makes a task of it. The engine lends these functions to its task
sources as plain callables (capabilities do not import storage).
"""

from __future__ import annotations

from typing import Any

from workflow_engine.domain.values import JsonObject
from workflow_engine.storage._pool import Connection, Pool, on_connection

# Their table, as the search path finds it, with the two columns a task is started from: a
# `tasks` table of some other application is not theirs.
_TABLE_EXISTS = """
SELECT count(*) = 2 FROM pg_attribute
 WHERE attrelid = to_regclass('tasks') AND attname IN ('id', 'prompt') AND NOT attisdropped
"""

_SELECT_TASK = "SELECT to_jsonb(t) FROM tasks t WHERE t.id = %(task_id)s"


async def table_exists(pool: Pool) -> bool:
    """Whether the database has the orchestrator's ``tasks`` table."""

    async def read(conn: Connection) -> Any:
        cur = await conn.execute(_TABLE_EXISTS)
        return await cur.fetchone()

    row = await on_connection(pool, read)
    return bool(row and row[0])


async def read_task(pool: Pool, task_id: str) -> JsonObject | None:
    """The task's row as JSON (column: value), or `None` when there is no such row."""

    async def read(conn: Connection) -> Any:
        cur = await conn.execute(_SELECT_TASK, {"task_id": task_id})
        return await cur.fetchone()

    row = await on_connection(pool, read)
    if row is None:
        return None
    task = row[0]
    assert isinstance(task, dict)
    return task
