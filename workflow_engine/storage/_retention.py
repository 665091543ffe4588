"""Retention's SQL: what is removed of a finished workflow once it is old, one small batch at a
time.

A workflow is due when its row is the engine's (`engine_owned`), it has ended (SUCCEEDED,
FAILED, CANCELLED), its row last changed (`updated_at`) before the cutoff, and it has events
not pruned yet (`event_seq > pruned_seq`; with `delete_rows`, any such row is due), and this
engine reads its state format (a newer engine's row is left to it). Pruning
removes its events but the one that ended it (so that a watch still ends, with its final
status), and its task (`workflow_tasks`); the row is kept, marked (`pruned_seq`), since the
orchestrator reads it. With `delete_rows` the row goes too, with the last event, and so does
the task's lease row where the engine took it last and nobody holds it.

One batch is one short transaction (`prune_batch`), bounded by `statement_timeout` and
`lock_timeout`, that never waits for a row: it locks the lease rows, then the workflow rows
(the order every writer of a task's rows keeps, see `_row_writes`), each ``FOR UPDATE SKIP
LOCKED``, and re-checks that each row is still due as it locks it, so a workflow that anyone
touches meanwhile is left for a later round. The batch holds a transaction-level advisory lock:
one batch at a time across the fleet, which a transaction-mode pooler keeps working (a
session-level lock would stay on whatever server connection the pooler gave it).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import LiteralString

from workflow_engine.domain.state_format import FIRST_STATE_FORMAT, STATE_FORMAT
from workflow_engine.storage._pool import Connection

# Any fixed 64-bit number unlikely to collide with an application's own advisory locks (the
# migrations take 0x77E6_0001).
RETENTION_LOCK_KEY = 0x77E6_0002

# The statuses of a finished workflow (`TERMINAL_STATUSES`), spelt as the index's predicate
# spells them, so that the planner sees the index serves the statements below.
_FINISHED = "c.engine_owned AND c.status IN ('SUCCEEDED', 'FAILED', 'CANCELLED')"
# Due: finished, old, and not pruned yet (`%(pruned_too)s`: pruned ones too, rows and all).
_DUE = (
    _FINISHED
    + """
   AND (c.event_seq > c.pruned_seq) = ANY(%(keys)s)
   AND c.updated_at < now() - make_interval(secs => %(older_than)s)
   AND c.state_format BETWEEN %(first_format)s AND %(state_format)s"""
)

# A batch never waits long for a lock, nor runs long: either fails it, and it is tried again at
# the next round (nothing of it took effect).
_LIMITS = (
    "SELECT set_config('lock_timeout', '2s', true), set_config('statement_timeout', '20s', true)"
)
_TRY_LOCK = "SELECT pg_try_advisory_xact_lock(%(key)s)"
_WAIT_LOCK = "SELECT true FROM pg_advisory_xact_lock(%(key)s)"

_LEASE_FREE = "(l.holder_id IS NULL OR l.expires_at IS NULL OR l.expires_at <= now())"
# Due workflows whose lease nobody holds now.
_CANDIDATES = (
    "SELECT c.task_id FROM workflow_checkpoints c WHERE "
    + _DUE
    + """
   AND NOT EXISTS (SELECT 1 FROM task_workflow_leases l
                    WHERE l.task_id = c.task_id AND NOT """
    + _LEASE_FREE
    + """)
 LIMIT %(limit)s"""
)

# The candidates' lease rows that nobody holds, locked; a lease row someone has locked is
# skipped, and so is its task. A task without a lease row has nothing to lock there.
_LOCK_LEASES = (
    "SELECT l.task_id FROM task_workflow_leases l WHERE l.task_id = ANY(%(ids)s) AND "
    + _LEASE_FREE
    + " ORDER BY l.task_id FOR UPDATE SKIP LOCKED"
)
_WITHOUT_LEASE = """
SELECT t.task_id FROM unnest(%(ids)s::uuid[]) AS t(task_id)
 WHERE NOT EXISTS (SELECT 1 FROM task_workflow_leases l WHERE l.task_id = t.task_id)
"""

# The workflow rows, locked, each checked again as it is locked: a row changed since the
# candidates were read (resumed, restarted, taken over) is due no more and is skipped.
_LOCK_ROWS = (
    "SELECT c.task_id FROM workflow_checkpoints c WHERE c.task_id = ANY(%(ids)s) AND "
    + _DUE
    + " ORDER BY c.task_id FOR UPDATE SKIP LOCKED"
)

# Every event but the newest terminal status event (all of them when `%(all)s`).
_DELETE_EVENTS = """
WITH keep AS (
    SELECT t.task_id,
           (SELECT max(e.seq) FROM workflow_events e
             WHERE e.task_id = t.task_id AND e.kind = 'status'
               AND e.status IN ('SUCCEEDED', 'FAILED', 'CANCELLED')) AS seq
      FROM unnest(%(ids)s::uuid[]) AS t(task_id)
)
DELETE FROM workflow_events e USING keep
 WHERE e.task_id = keep.task_id AND (%(all)s OR e.seq IS DISTINCT FROM keep.seq)
"""
_DELETE_TASKS = "DELETE FROM workflow_tasks WHERE task_id = ANY(%(ids)s)"
_MARK_PRUNED = "UPDATE workflow_checkpoints SET pruned_seq = event_seq WHERE task_id = ANY(%(ids)s)"
_DELETE_ROWS = "DELETE FROM workflow_checkpoints WHERE task_id = ANY(%(ids)s) AND engine_owned"
# Only a lease the engine took last (the orchestrator's own acquire writes another lease id),
# and only one nobody holds (these rows are locked, and were free when locked).
_DELETE_LEASES = (
    "DELETE FROM task_workflow_leases l WHERE l.task_id = ANY(%(ids)s)"
    " AND l.lease_id = l.engine_lease_id AND " + _LEASE_FREE
)

# What a round would remove now, read in one snapshot (`prune --dry-run`).
_COUNT_DUE = (
    """
WITH due AS (SELECT c.task_id FROM workflow_checkpoints c
              LEFT JOIN task_workflow_leases l ON l.task_id = c.task_id
              WHERE """
    + _DUE
    + " AND (l.task_id IS NULL OR "
    + _LEASE_FREE
    + """)
), keep AS (
    SELECT due.task_id,
           (SELECT max(k.seq) FROM workflow_events k
             WHERE k.task_id = due.task_id AND k.kind = 'status'
               AND k.status IN ('SUCCEEDED', 'FAILED', 'CANCELLED')) AS seq
      FROM due
)
SELECT (SELECT count(*) FROM due),
       (SELECT count(*) FROM workflow_events e JOIN keep USING (task_id)
         WHERE %(all)s OR e.seq IS DISTINCT FROM keep.seq),
       (SELECT count(*) FROM workflow_tasks t JOIN due USING (task_id)),
       (SELECT count(*) FROM due WHERE %(all)s),
       (SELECT count(*) FROM task_workflow_leases l JOIN due USING (task_id)
         WHERE %(all)s AND l.lease_id = l.engine_lease_id)
"""
)


@dataclass(frozen=True, slots=True)
class Pruned:
    """What pruning removed (or, for a dry run, would remove): workflows pruned, and rows
    deleted from each table."""

    workflows: int = 0
    workflow_events: int = 0
    workflow_tasks: int = 0
    workflow_checkpoints: int = 0
    task_workflow_leases: int = 0

    def __add__(self, other: Pruned) -> Pruned:
        return Pruned(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @property
    def tables(self) -> dict[str, int]:
        """Rows deleted, by table."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "workflows"}


def _params(older_than_seconds: float, delete_rows: bool) -> dict[str, object]:
    return {
        "older_than": older_than_seconds,
        "keys": [True, False] if delete_rows else [True],
        "all": delete_rows,
        # A row of a state format this engine does not read is a newer engine's to prune.
        "first_format": FIRST_STATE_FORMAT,
        "state_format": STATE_FORMAT,
    }


async def prune_batch(
    conn: Connection,
    *,
    older_than_seconds: float,
    delete_rows: bool,
    limit: int,
    wait: bool = False,
) -> Pruned | None:
    """Prune up to `limit` due workflows in one transaction on `conn` (in autocommit mode);
    `None` when another batch holds the retention lock (with `wait`, wait for it instead).
    A batch that pruned nothing means nothing is due (or what is due is written right now)."""
    params = _params(older_than_seconds, delete_rows)
    async with conn.transaction():
        cur = await conn.execute(_WAIT_LOCK if wait else _TRY_LOCK, {"key": RETENTION_LOCK_KEY})
        locked = await cur.fetchone()
        if locked is None or not locked[0]:
            return None
        await conn.execute(_LIMITS)
        candidates = await _task_ids(conn, _CANDIDATES, {**params, "limit": limit})
        if not candidates:
            return Pruned()
        free = await _task_ids(conn, _LOCK_LEASES, {"ids": candidates})
        free += await _task_ids(conn, _WITHOUT_LEASE, {"ids": candidates})
        ids = await _task_ids(conn, _LOCK_ROWS, {**params, "ids": free}) if free else []
        if not ids:
            return Pruned()
        return await _remove(conn, ids, delete_rows)


async def _remove(conn: Connection, ids: list[object], delete_rows: bool) -> Pruned:
    """Delete what pruning removes of the locked, due workflows `ids`."""
    args = {"ids": ids, "all": delete_rows}
    events = (await conn.execute(_DELETE_EVENTS, args)).rowcount
    tasks = (await conn.execute(_DELETE_TASKS, args)).rowcount
    if not delete_rows:
        await conn.execute(_MARK_PRUNED, args)
        return Pruned(len(ids), events, tasks)
    rows = (await conn.execute(_DELETE_ROWS, args)).rowcount
    lease_rows = (await conn.execute(_DELETE_LEASES, args)).rowcount
    return Pruned(len(ids), events, tasks, rows, lease_rows)


async def count_due(conn: Connection, *, older_than_seconds: float, delete_rows: bool) -> Pruned:
    """What pruning everything due now would remove; nothing is locked or changed."""
    async with conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        cur = await conn.execute(_COUNT_DUE, _params(older_than_seconds, delete_rows))
        row = await cur.fetchone()
    assert row is not None
    return Pruned(*(int(n) for n in row))


async def _task_ids(
    conn: Connection, sql: LiteralString, params: dict[str, object]
) -> list[object]:
    cur = await conn.execute(sql, params)
    return [row[0] for row in await cur.fetchall()]
