"""The task table (``workflow_tasks``): the spec a workflow was started with.

The start transaction stores it (`store`); the task source reads it back when a run begins
(`load`).
"""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from workflow_engine.domain.values import JsonObject
from workflow_engine.errors import WorkflowNotFound
from workflow_engine.storage._pool import Connection, Pool, on_connection

_UPSERT_TASK = """
INSERT INTO workflow_tasks (task_id, spec) VALUES (%(task_id)s, %(spec)s)
ON CONFLICT (task_id) DO UPDATE SET spec = EXCLUDED.spec, created_at = now()
"""

#: The same upsert inside a bigger statement: the task is stored once per row of `{source}`
#: (a CTE that produced the workflow row), with `%(spec)s` as its spec.
UPSERT_FROM = """
INSERT INTO workflow_tasks (task_id, spec) SELECT task_id, %(spec)s FROM {source}
ON CONFLICT (task_id) DO UPDATE SET spec = EXCLUDED.spec, created_at = now()
"""

_SELECT_TASK = "SELECT spec FROM workflow_tasks WHERE task_id = %(task_id)s"


async def store(conn: Connection, task_id: str, spec: JsonObject) -> None:
    """Store (or replace) the task's spec, in the caller's transaction."""
    await conn.execute(_UPSERT_TASK, {"task_id": task_id, "spec": Jsonb(spec)})


async def load(pool: Pool, task_id: str) -> JsonObject:
    """The spec the task's workflow was started with; `WorkflowNotFound` when there is none."""

    async def read(conn: Connection) -> Any:
        cur = await conn.execute(_SELECT_TASK, {"task_id": task_id})
        return await cur.fetchone()

    row = await on_connection(pool, read)
    if row is None:
        raise WorkflowNotFound(task_id)
    spec = row[0]
    assert isinstance(spec, dict)
    return spec
