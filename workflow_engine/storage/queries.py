"""The read model: a workflow row with its lease, its events, and ListWorkflows' pages.

Reads only. `select_workflow` is also how the writes in `workflow_rows` read (and, with
``lock=True``, lock) the row inside their own transactions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, LiteralString

from psycopg.rows import dict_row

from workflow_engine.domain.records import (
    WorkflowEventRecord,
    WorkflowListItem,
    WorkflowPage,
    WorkflowQuery,
    WorkflowRecord,
)
from workflow_engine.domain.state_format import unreadable_reason
from workflow_engine.domain.status import OUTSIDE_CHANGE
from workflow_engine.errors import WorkflowNotFound
from workflow_engine.storage._pool import Connection, Pool, in_transaction, on_connection
from workflow_engine.version import __version__

#: GetWorkflow's history holds at most this many events: the newest ones, oldest first.
MAX_HISTORY_EVENTS = 1000

# `blocked_reason`: the one recorded, else the outside change the row is marked with (so a
# write by another writer is visible at once, before any resume meets it).
_SELECT_WORKFLOW = """
SELECT c.task_id::text AS task_id, c.run_id::text AS run_id, c.status, c.last_node_id,
       c.state, c.updated_at, c.summary, c.error, c.idempotency_key::text AS idempotency_key,
       c.event_seq, c.checkpoint_id IS NOT NULL AS has_checkpoint,
       l.holder_id AS lease_holder_id, l.expires_at AS lease_expires_at,
       CASE WHEN c.blocked_reason <> '' THEN c.blocked_reason
            WHEN c.changed_outside THEN %(outside_change)s ELSE '' END AS blocked_reason,
       c.stopped_reason, c.user_id, c.project_id, c.state_format, c.engine_version,
       COALESCE(c.schedule_id, '') AS schedule_id, c.schedule_slot
  FROM workflow_checkpoints c
  LEFT JOIN task_workflow_leases l ON l.task_id = c.task_id
 WHERE c.task_id = %(task_id)s AND c.engine_owned
"""

_SELECT_EVENTS = """
SELECT seq, kind, node_id, status, created_at, run_id::text, detail, actor
  FROM workflow_events
 WHERE task_id = %(task_id)s AND seq >= %(from_seq)s
 ORDER BY seq
 LIMIT %(limit)s
"""

# The task's newest events, oldest first.
_SELECT_HISTORY = """
SELECT seq, kind, node_id, status, created_at, run_id, detail, actor
  FROM (SELECT seq, kind, node_id, status, created_at, run_id::text, detail, actor
          FROM workflow_events
         WHERE task_id = %(task_id)s
         ORDER BY seq DESC
         LIMIT %(limit)s) newest
 ORDER BY seq
"""

# ListWorkflows: newest update first, keyset-paginated on (updated_at DESC, task_id), which is
# the order of workflow_checkpoints_list_idx. `list_statement` appends the WHERE clause.
_LIST_WORKFLOWS = """
SELECT c.task_id::text AS task_id, c.run_id::text AS run_id, c.status, c.last_node_id,
       c.updated_at, c.summary, c.error, c.stopped_reason,
       l.holder_id AS lease_holder_id, l.expires_at AS lease_expires_at,
       COALESCE(c.schedule_id, '') AS schedule_id, c.schedule_slot
  FROM workflow_checkpoints c
  LEFT JOIN task_workflow_leases l ON l.task_id = c.task_id
 WHERE c.engine_owned
"""
_LIST_ORDER = """
 ORDER BY c.updated_at DESC, c.task_id
 LIMIT %(limit)s
"""


async def select_workflow(
    conn: Connection, task_id: str, *, lock: bool = False
) -> WorkflowRecord | None:
    """The task's row with its lease on `conn`; ``lock`` takes the row lock (FOR UPDATE).

    Only the engine's own rows: a row another writer created is none of its business.
    """
    query = _SELECT_WORKFLOW + (" FOR UPDATE OF c" if lock else "")
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, {"task_id": task_id, "outside_change": OUTSIDE_CHANGE})
        row = await cur.fetchone()
    if row is None:
        return None
    record = WorkflowRecord(**row)
    if not record.readable:  # a newer engine's row: say why it is left alone
        reason = unreadable_reason(record.state_format, record.engine_version, __version__)
        record = dataclasses.replace(record, blocked_reason=reason)
    return record


async def get(pool: Pool, task_id: str) -> WorkflowRecord:
    record = await on_connection(pool, lambda conn: select_workflow(conn, task_id))
    if record is None:
        raise WorkflowNotFound(task_id)
    return record


async def get_with_history(
    pool: Pool, task_id: str, limit: int = MAX_HISTORY_EVENTS
) -> tuple[WorkflowRecord, Sequence[WorkflowEventRecord]]:
    """The workflow and its newest `limit` events, oldest first, from one snapshot."""

    async def read(conn: Connection) -> tuple[WorkflowRecord | None, Sequence[WorkflowEventRecord]]:
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        record = await select_workflow(conn, task_id)
        if record is None:
            return None, ()
        cur = await conn.execute(_SELECT_HISTORY, {"task_id": task_id, "limit": limit})
        return record, [WorkflowEventRecord(*row) for row in await cur.fetchall()]

    record, history = await in_transaction(pool, read)
    if record is None:
        raise WorkflowNotFound(task_id)
    return record, history


async def events(
    pool: Pool, task_id: str, from_seq: int, limit: int = 500
) -> list[WorkflowEventRecord]:
    async def read(conn: Connection) -> list[WorkflowEventRecord]:
        cur = await conn.execute(
            _SELECT_EVENTS, {"task_id": task_id, "from_seq": from_seq, "limit": limit}
        )
        return [WorkflowEventRecord(*row) for row in await cur.fetchall()]

    return await on_connection(pool, read)


def list_statement(query: WorkflowQuery) -> tuple[LiteralString, dict[str, Any]]:
    """ListWorkflows' statement for `query` and its parameters (one row more than a page)."""
    where: list[LiteralString] = []
    if query.statuses:
        where.append("c.status = ANY(%(statuses)s)")
    if query.user_id:
        where.append("c.user_id = %(user_id)s")
    if query.project_id:
        where.append("c.project_id = %(project_id)s")
    if query.schedule_id:
        where.append("c.schedule_id = %(schedule_id)s")
    scope = query.scope
    if scope is not None and scope.projects:
        where.append("c.project_id = ANY(%(scope_projects)s)")
    if scope is not None and scope.users:
        where.append("c.user_id = ANY(%(scope_users)s)")
    if query.updated_after is not None:
        where.append("c.updated_at >= %(updated_after)s")
    if query.updated_before is not None:
        where.append("c.updated_at < %(updated_before)s")
    if query.after is not None:
        where.append(
            "(c.updated_at < %(after_updated_at)s"
            " OR (c.updated_at = %(after_updated_at)s AND c.task_id > %(after_task_id)s::uuid))"
        )
    sql = _LIST_WORKFLOWS + "".join(" AND " + clause for clause in where) + _LIST_ORDER
    params: dict[str, Any] = {
        "statuses": list(query.statuses),
        "user_id": query.user_id,
        "project_id": query.project_id,
        "schedule_id": query.schedule_id,
        "scope_projects": sorted(scope.projects) if scope else [],
        "scope_users": sorted(scope.users) if scope else [],
        "updated_after": query.updated_after,
        "updated_before": query.updated_before,
        "after_updated_at": query.after[0] if query.after else None,
        "after_task_id": query.after[1] if query.after else None,
        "limit": query.limit + 1,  # one more tells whether another page follows
    }
    return sql, params


async def list_workflows(pool: Pool, query: WorkflowQuery) -> WorkflowPage:
    """One page of workflows matching `query`, newest update first."""
    sql, params = list_statement(query)

    async def read(conn: Connection) -> Sequence[WorkflowListItem]:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql, params)
            return [WorkflowListItem(**row) for row in await cur.fetchall()]

    rows = await on_connection(pool, read)
    items = rows[: query.limit]
    more = len(rows) > query.limit
    last = items[-1] if items else None
    return WorkflowPage(
        items=items,
        next_after=(last.updated_at, last.task_id) if more and last else None,
    )
