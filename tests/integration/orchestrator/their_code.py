"""SQL standing for the orchestrator's own Go code acting on the shared rows.

Restated from `shared/reference/orchestrator-contracts.md` ("How their Go code acts on the shared
rows"): acquire reads the lease row, then writes it (two statements, no lock); release is by
`lease_id` and sets holder and expiry to null; checkpoint upserts `state` and `last_node_id` by
`task_id` without looking at the lease. Every insert gives `id` and timestamps, as their ORM does.
On the soft-delete schema every read of theirs filters ``deleted_at IS NULL``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg.types.json import Jsonb

Conn = psycopg.AsyncConnection[Any]


async def _soft_delete(conn: Conn, table: str) -> str:
    cur = await conn.execute(
        "SELECT 1 FROM information_schema.columns WHERE table_name = %s AND column_name = %s",
        (table, "deleted_at"),
    )
    return " AND deleted_at IS NULL" if await cur.fetchone() else ""


@dataclass(frozen=True)
class Acquired:
    status: Literal["started", "already_running", "conflict"]
    lease_id: str


async def acquire(
    conn: Conn, task_id: str, holder_id: str, lease_id: str | None = None, ttl: int = 3600
) -> Acquired:
    """Their acquire: read the lease row, then insert it or overwrite a released or expired one."""
    lease_id = lease_id or str(uuid.uuid4())
    live = await _soft_delete(conn, "task_workflow_leases")
    cur = await conn.execute(
        "SELECT id, lease_id::text, holder_id, expires_at IS NOT NULL AND expires_at > now()"
        " FROM task_workflow_leases WHERE task_id = %s" + live,  # type: ignore[operator]
        (task_id,),
    )
    row = await cur.fetchone()
    if row is None:
        await conn.execute(
            "INSERT INTO task_workflow_leases"
            " (id, task_id, lease_id, holder_id, expires_at, created_at, updated_at)"
            " VALUES (%s, %s, %s, %s, now() + make_interval(secs => %s), now(), now())",
            (str(uuid.uuid4()), task_id, lease_id, holder_id, ttl),
        )
        return Acquired("started", lease_id)
    row_id, current_lease, holder, is_live = row
    if is_live and holder is not None:
        if holder == holder_id and current_lease == lease_id:
            return Acquired("already_running", lease_id)
        return Acquired("conflict", current_lease)
    await conn.execute(
        "UPDATE task_workflow_leases SET lease_id = %s, holder_id = %s,"
        " expires_at = now() + make_interval(secs => %s), updated_at = now() WHERE id = %s",
        (lease_id, holder_id, ttl, row_id),
    )
    return Acquired("started", lease_id)


async def release(conn: Conn, task_id: str, lease_id: str) -> None:
    """Their release: by lease id; idempotent."""
    await conn.execute(
        "UPDATE task_workflow_leases SET holder_id = NULL, expires_at = NULL, updated_at = now()"
        " WHERE task_id = %s AND lease_id = %s",
        (task_id, lease_id),
    )


async def checkpoint(conn: Conn, task_id: str, state: Any, last_node_id: str) -> None:
    """Their checkpoint: upsert state and last_node_id by task id, without the lease."""
    live = await _soft_delete(conn, "workflow_checkpoints")
    cur = await conn.execute(
        "SELECT id FROM workflow_checkpoints WHERE task_id = %s" + live,  # type: ignore[operator]
        (task_id,),
    )
    row = await cur.fetchone()
    if row is None:
        has_created_at = await conn.execute(
            "SELECT 1 FROM information_schema.columns"
            " WHERE table_name = 'workflow_checkpoints' AND column_name = 'created_at'"
        )
        columns = "id, task_id, state, last_node_id, updated_at"
        values = "%s, %s, %s, %s, now()"
        if await has_created_at.fetchone():
            columns, values = columns + ", created_at", values + ", now()"
        await conn.execute(
            f"INSERT INTO workflow_checkpoints ({columns}) VALUES ({values})",  # type: ignore[arg-type]
            (str(uuid.uuid4()), task_id, Jsonb(state), last_node_id),
        )
        return
    await conn.execute(
        "UPDATE workflow_checkpoints SET state = %s, last_node_id = %s, updated_at = now()"
        " WHERE id = %s",
        (Jsonb(state), last_node_id, row[0]),
    )


async def stub_runner(conn: Conn, task_id: str, holder_id: str = "their-runner") -> str:
    """Their own stub runner: start, checkpoint at verify_step_result, resume (a read), release.
    Returns the lease id it used."""
    acquired = await acquire(conn, task_id, holder_id)
    assert acquired.status == "started", acquired
    state = {"task_id": task_id, "plan": {"steps": ["theirs"]}, "current_step_index": 0}
    await checkpoint(conn, task_id, state, "verify_step_result")
    await conn.execute(
        "SELECT state, last_node_id FROM workflow_checkpoints WHERE task_id = %s", (task_id,)
    )
    await release(conn, task_id, acquired.lease_id)
    return acquired.lease_id
