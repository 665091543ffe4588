"""Workflow rows as the API sees them: create with the lease, claim for resume, read, cancel.

Each public method is one transaction. A request that is refused (lease held, workflow exists)
is decided inside the transaction and rolled back, so it changes nothing that is stored.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, LiteralString

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from workflow_engine.domain.status import PAUSED_STATUSES, RECOVERY_EXHAUSTED, TERMINAL_STATUSES
from workflow_engine.errors import LeaseHeld, WorkflowExists, WorkflowNotFound
from workflow_engine.spec import JsonObject
from workflow_engine.storage import leases
from workflow_engine.storage.leases import Fence, Lease
from workflow_engine.storage.retry import with_retry

_SELECT_WORKFLOW = """
SELECT c.task_id::text AS task_id, c.run_id::text AS run_id, c.status, c.last_node_id,
       c.state, c.updated_at, c.summary, c.error, c.idempotency_key::text AS idempotency_key,
       c.event_seq, c.checkpoint_id IS NOT NULL AS has_checkpoint,
       l.holder_id AS lease_holder_id, l.expires_at AS lease_expires_at
  FROM workflow_checkpoints c
  LEFT JOIN task_workflow_leases l ON l.task_id = c.task_id
 WHERE c.task_id = %(task_id)s
"""

_INSERT_WORKFLOW = """
INSERT INTO workflow_checkpoints
    (task_id, state, last_node_id, run_id, status, lease_epoch, idempotency_key, event_seq,
     user_id, project_id)
VALUES (%(task_id)s, %(state)s, NULL, %(run_id)s, 'RUNNING', %(epoch)s, %(idempotency_key)s, 1,
        %(user_id)s, %(project_id)s)
ON CONFLICT (task_id) DO NOTHING
RETURNING run_id
"""

_UPSERT_TASK = """
INSERT INTO workflow_tasks (task_id, spec) VALUES (%(task_id)s, %(spec)s)
ON CONFLICT (task_id) DO UPDATE SET spec = EXCLUDED.spec, created_at = now()
"""

# Every transaction that touches both rows of a task locks the lease row first, as the
# checkpoint write does (FOR SHARE), so two of them never wait on each other in a cycle.
_LOCK_LEASE = "SELECT 1 FROM task_workflow_leases WHERE task_id = %(task_id)s FOR UPDATE"

# RUNNING workflows nobody is running: their lease was released (drain) or expired (crash).
_ORPHANS = """
SELECT c.task_id::text
  FROM workflow_checkpoints c
  JOIN task_workflow_leases l ON l.task_id = c.task_id
 WHERE c.status = 'RUNNING' AND (l.holder_id IS NULL OR l.expires_at <= now())
 ORDER BY c.updated_at
 LIMIT %(limit)s
"""

# Tells every replica's event listener that a task's workflow was cancelled (see `EventHub`).
CONTROL_CHANNEL = "workflow_control"
_NOTIFY_CONTROL = "SELECT pg_notify('workflow_control', %(task_id)s::text)"

_COUNT_RECOVERY = """
UPDATE workflow_checkpoints SET recovery_attempts = recovery_attempts + 1
 WHERE task_id = %(task_id)s
RETURNING recovery_attempts
"""

_SELECT_TASK = "SELECT spec FROM workflow_tasks WHERE task_id = %(task_id)s"

_INSERT_STATUS_EVENT = """
INSERT INTO workflow_events (task_id, seq, run_id, kind, node_id, status)
VALUES (%(task_id)s, %(seq)s, %(run_id)s, 'status', NULL, %(status)s)
"""

_SET_STATUS = """
UPDATE workflow_checkpoints
   SET status = %(status)s,
       state = CASE WHEN jsonb_typeof(state) = 'object'  -- a hand-edited row may hold anything
                    THEN jsonb_set(state, '{status}', to_jsonb(lower(%(status)s)))
                    ELSE state END,
       error = CASE WHEN %(error)s = '' THEN error ELSE %(error)s END,
       event_seq = event_seq + 1,
       updated_at = now()
 WHERE task_id = %(task_id)s
RETURNING event_seq
"""

_SELECT_EVENTS = """
SELECT seq, kind, node_id, status, created_at, run_id::text, detail, actor
  FROM workflow_events
 WHERE task_id = %(task_id)s AND seq >= %(from_seq)s
 ORDER BY seq
 LIMIT %(limit)s
"""

#: GetWorkflow's history holds at most this many events: the newest ones, oldest first.
MAX_HISTORY_EVENTS = 1000

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
# the order of workflow_checkpoints_list_idx. `WorkflowStore.list` appends the WHERE clause.
_LIST_WORKFLOWS = """
SELECT c.task_id::text AS task_id, c.run_id::text AS run_id, c.status, c.last_node_id,
       c.updated_at, c.summary, c.error,
       l.holder_id AS lease_holder_id, l.expires_at AS lease_expires_at
  FROM workflow_checkpoints c
  LEFT JOIN task_workflow_leases l ON l.task_id = c.task_id
"""
_LIST_ORDER = """
 ORDER BY c.updated_at DESC, c.task_id
 LIMIT %(limit)s
"""


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    """A task's workflow row joined with its lease."""

    task_id: str
    run_id: str
    status: str
    last_node_id: str | None
    state: JsonObject
    updated_at: datetime
    summary: str
    error: str
    idempotency_key: str | None
    event_seq: int
    has_checkpoint: bool
    lease_holder_id: str | None
    lease_expires_at: datetime | None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True, slots=True)
class StartOutcome:
    """How a start was answered, and the truth about the workflow it is about.

    STARTED: this call stored and leased it. ALREADY_RUNNING / ALREADY_FINISHED: its idempotency
    key started the workflow, which is not finished / finished; nothing changed. `lease` is the
    live lease on the task, `None` when none is (paused, finished, or its runner stopped).
    """

    status: Literal["STARTED", "ALREADY_RUNNING", "ALREADY_FINISHED"]
    run_id: str
    workflow_status: str
    lease: Lease | None


@dataclass(frozen=True, slots=True)
class ResumeClaim:
    """The row a resume continues from, and the lease it now holds (`None`: nothing to run)."""

    record: WorkflowRecord
    lease: Lease | None


@dataclass(frozen=True, slots=True)
class WorkflowEventRecord:
    seq: int
    kind: str  # 'node', 'status', 'approval_requested', 'approval_decided', 'overridden'
    node_id: str | None
    status: str
    created_at: datetime
    run_id: str | None
    detail: str = ""  # what came of it, e.g. a verification's "pass" / "fail"
    actor: str = ""  # who caused it (decisions, overrides)


@dataclass(frozen=True, slots=True)
class WorkflowQuery:
    """What ListWorkflows asks for; empty filters match everything."""

    statuses: tuple[str, ...] = ()
    user_id: str = ""
    project_id: str = ""
    updated_after: datetime | None = None  # inclusive
    updated_before: datetime | None = None  # exclusive
    limit: int = 50
    # Start after this (updated_at, task_id): the last row of the previous page.
    after: tuple[datetime, str] | None = None


@dataclass(frozen=True, slots=True)
class WorkflowListItem:
    """A workflow as ListWorkflows shows it: the row without its state, joined with its lease."""

    task_id: str
    run_id: str | None
    status: str
    last_node_id: str | None
    updated_at: datetime
    summary: str
    error: str
    lease_holder_id: str | None
    lease_expires_at: datetime | None


@dataclass(frozen=True, slots=True)
class WorkflowPage:
    items: Sequence[WorkflowListItem]
    # (updated_at, task_id) of the last item when more rows follow; None on the last page.
    next_after: tuple[datetime, str] | None


class _Refused(Exception):
    """Raised inside a transaction to roll it back; carries what to answer instead."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class WorkflowStore:
    """The engine's reads and writes of workflow rows, outside the per-node checkpoint."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self._pool = pool

    async def create(
        self,
        *,
        task_id: str,
        holder_id: str,
        idempotency_key: str | None,
        ttl_seconds: float,
        spec: JsonObject,
        initial_state: JsonObject,
    ) -> StartOutcome:
        """Take the lease, store the task and its first checkpoint row, in one transaction."""
        lease_id = idempotency_key or str(uuid.uuid4())
        run_id = str(uuid.uuid4())
        for _ in range(3):  # a lease released between refusal and diagnosis is simply retried
            try:
                return await with_retry(
                    lambda: self._create_once(
                        task_id,
                        holder_id,
                        lease_id,
                        idempotency_key,
                        ttl_seconds,
                        spec,
                        initial_state,
                        run_id,
                    )
                )
            except _Refused:
                outcome = await self._explain_refused_start(task_id, holder_id, idempotency_key)
                if outcome is not None:
                    return outcome
        raise LeaseHeld(task_id, None, None)

    async def _create_once(
        self,
        task_id: str,
        holder_id: str,
        lease_id: str,
        idempotency_key: str | None,
        ttl_seconds: float,
        spec: JsonObject,
        initial_state: JsonObject,
        run_id: str,
    ) -> StartOutcome:
        metadata = spec.get("metadata") or {}
        async with self._pool.connection() as conn, conn.transaction():
            lease = await leases.acquire(
                conn,
                task_id=task_id,
                lease_id=lease_id,
                holder_id=holder_id,
                ttl_seconds=ttl_seconds,
            )
            if lease is None:
                raise _Refused("lease")
            cur = await conn.execute(
                _INSERT_WORKFLOW,
                {
                    "task_id": task_id,
                    "state": Jsonb(initial_state),
                    "run_id": run_id,
                    "epoch": lease.epoch,
                    "idempotency_key": idempotency_key,
                    "user_id": str(metadata.get("user_id") or ""),
                    "project_id": str(metadata.get("project_id") or ""),
                },
            )
            if await cur.fetchone() is None:
                raise _Refused("exists")
            await conn.execute(_UPSERT_TASK, {"task_id": task_id, "spec": Jsonb(spec)})
            await conn.execute(
                _INSERT_STATUS_EVENT,
                {"task_id": task_id, "seq": 1, "run_id": run_id, "status": "RUNNING"},
            )
        return StartOutcome(status="STARTED", run_id=run_id, workflow_status="RUNNING", lease=lease)

    async def _explain_refused_start(
        self, task_id: str, holder_id: str, idempotency_key: str | None
    ) -> StartOutcome | None:
        """Answer a start that could not store a workflow; `None` means try again.

        Decided from one snapshot of the lease and the workflow, in this order:
        - the workflow this key started: finished, ALREADY_FINISHED; not finished and no lease
          live, or the requesting holder's live lease, ALREADY_RUNNING (with its real status);
        - anyone else's live lease, or the holder's own under another key or none: LeaseHeld;
        - a workflow started under another key or none, with no lease live: WorkflowExists;
        - neither a live lease nor a workflow (the lease was released meanwhile): try again.
        """
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            lease = await leases.current(conn, task_id)
            record = await _select_workflow(conn, task_id)
        live = lease if lease is not None and lease.live else None
        if (
            record is not None
            and idempotency_key is not None
            and record.idempotency_key == idempotency_key
        ):
            if record.terminal:
                return StartOutcome("ALREADY_FINISHED", record.run_id, record.status, None)
            if live is None or live.holder_id == holder_id:
                return StartOutcome("ALREADY_RUNNING", record.run_id, record.status, live)
        if live is not None:
            raise LeaseHeld(task_id, live.holder_id, live.expires_at)
        if record is not None:
            raise WorkflowExists(task_id, record.status)
        return None

    async def claim_for_resume(
        self,
        *,
        task_id: str,
        holder_id: str,
        ttl_seconds: float,
        max_recoveries: int | None = None,
    ) -> ResumeClaim:
        """Take the lease of an unfinished workflow; a finished one is returned as it is.

        With `max_recoveries`, this is an automatic recovery: it is counted, and the claim that
        goes over the cap marks the workflow FAILED ("recovery attempts exhausted") instead.
        """
        try:
            return await with_retry(
                lambda: self._claim_once(task_id, holder_id, ttl_seconds, max_recoveries)
            )
        except _Refused:
            async with self._pool.connection() as conn:
                lease = await leases.current(conn, task_id)
            raise LeaseHeld(
                task_id, lease.holder_id if lease else None, lease.expires_at if lease else None
            ) from None

    async def _claim_once(
        self, task_id: str, holder_id: str, ttl_seconds: float, max_recoveries: int | None
    ) -> ResumeClaim:
        async with self._pool.connection() as conn, conn.transaction():
            record = await _lock_workflow(conn, task_id)
            if record.terminal:
                return ResumeClaim(record=record, lease=None)
            lease = await leases.acquire(
                conn,
                task_id=task_id,
                lease_id=str(uuid.uuid4()),
                holder_id=holder_id,
                ttl_seconds=ttl_seconds,
                take_own=True,
            )
            if lease is None:
                raise _Refused("lease")
            if max_recoveries is not None:
                cur = await conn.execute(_COUNT_RECOVERY, {"task_id": task_id})
                counted = await cur.fetchone()
                if counted is not None and counted[0] > max_recoveries:
                    await _set_status(conn, record, "FAILED", RECOVERY_EXHAUSTED)
                    await leases.release(
                        conn, Fence(task_id, record.run_id, holder_id, lease.epoch)
                    )
                    return ResumeClaim(record=await _lock_workflow(conn, task_id), lease=None)
            # A paused workflow keeps its status until the decision or budget that continues
            # it is written; anything else was interrupted and runs again.
            if record.status not in ("RUNNING", *PAUSED_STATUSES):
                await _set_status(conn, record, "RUNNING", "")
                record = await _lock_workflow(conn, task_id)
        return ResumeClaim(record=record, lease=lease)

    async def orphans(self, limit: int = 100) -> list[str]:
        """Task ids of RUNNING workflows whose lease was released or has expired."""

        async def read() -> list[str]:
            async with self._pool.connection() as conn:
                cur = await conn.execute(_ORPHANS, {"limit": limit})
                return [row[0] for row in await cur.fetchall()]

        return await with_retry(read)

    async def get(self, task_id: str) -> WorkflowRecord:
        async def read() -> WorkflowRecord | None:
            async with self._pool.connection() as conn:
                return await _select_workflow(conn, task_id)

        record = await with_retry(read)
        if record is None:
            raise WorkflowNotFound(task_id)
        return record

    async def get_with_history(
        self, task_id: str, limit: int = MAX_HISTORY_EVENTS
    ) -> tuple[WorkflowRecord, Sequence[WorkflowEventRecord]]:
        """The workflow and its newest `limit` events, oldest first, from one snapshot."""

        async def read() -> tuple[WorkflowRecord | None, Sequence[WorkflowEventRecord]]:
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                record = await _select_workflow(conn, task_id)
                if record is None:
                    return None, ()
                cur = await conn.execute(_SELECT_HISTORY, {"task_id": task_id, "limit": limit})
                return record, [WorkflowEventRecord(*row) for row in await cur.fetchall()]

        record, history = await with_retry(read)
        if record is None:
            raise WorkflowNotFound(task_id)
        return record, history

    async def cancel(self, task_id: str, reason: str) -> tuple[WorkflowRecord, bool]:
        """Mark an unfinished workflow cancelled and revoke its lease; finished ones stay as is.

        Returns the record after the call, and whether this call cancelled it. The same
        transaction notifies every replica (``workflow_control``), so the one running it stops
        it and its jobs without waiting for its next lease renewal.
        """

        async def once() -> tuple[WorkflowRecord, bool]:
            async with self._pool.connection() as conn, conn.transaction():
                record = await _lock_workflow(conn, task_id)
                if record.terminal:
                    return record, False
                await _set_status(conn, record, "CANCELLED", reason or "cancelled")
                await leases.revoke(conn, task_id)
                await conn.execute(_NOTIFY_CONTROL, {"task_id": task_id})
                updated = await _select_workflow(conn, task_id)
                assert updated is not None
                return updated, True

        return await with_retry(once)

    async def fence_holds(self, fence: Fence) -> bool:
        """Whether `fence` still holds its lease (a read: nothing is locked or written)."""

        async def read() -> bool:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    leases.FENCE_HOLDS,
                    {"task_id": fence.task_id, "holder_id": fence.holder_id, "epoch": fence.epoch},
                )
                return await cur.fetchone() is not None

        return await with_retry(read)

    async def set_status(self, fence: Fence, status: str, error: str = "") -> bool:
        """Set a status from a runner that still holds its lease; False when it does not."""

        async def once() -> bool:
            async with self._pool.connection() as conn, conn.transaction():
                if not await leases.lock_fenced(conn, fence):
                    return False
                record = await _select_workflow(conn, fence.task_id, lock=True)
                if record is None or record.status == status:
                    return record is not None
                await _set_status(conn, record, status, error)
                return True

        return await with_retry(once)

    async def load_task(self, task_id: str) -> JsonObject:
        async def read() -> Any:
            async with self._pool.connection() as conn:
                cur = await conn.execute(_SELECT_TASK, {"task_id": task_id})
                return await cur.fetchone()

        row = await with_retry(read)
        if row is None:
            raise WorkflowNotFound(task_id)
        spec = row[0]
        assert isinstance(spec, dict)
        return spec

    async def events(
        self, task_id: str, from_seq: int, limit: int = 500
    ) -> list[WorkflowEventRecord]:
        async def read() -> list[WorkflowEventRecord]:
            async with self._pool.connection() as conn:
                cur = await conn.execute(
                    _SELECT_EVENTS, {"task_id": task_id, "from_seq": from_seq, "limit": limit}
                )
                return [WorkflowEventRecord(*row) for row in await cur.fetchall()]

        return await with_retry(read)

    async def renew_lease(self, fence: Fence, ttl_seconds: float) -> datetime | None:
        async def once() -> datetime | None:
            async with self._pool.connection() as conn:
                return await leases.renew(conn, fence, ttl_seconds)

        return await with_retry(once, max_seconds=ttl_seconds / 3)

    async def release_lease(self, fence: Fence) -> bool:
        async def once() -> bool:
            async with self._pool.connection() as conn:
                return await leases.release(conn, fence)

        return await with_retry(once)

    async def list_workflows(self, query: WorkflowQuery) -> WorkflowPage:
        """One page of workflows matching `query`, newest update first."""
        where: list[LiteralString] = []
        if query.statuses:
            where.append("c.status = ANY(%(statuses)s)")
        if query.user_id:
            where.append("c.user_id = %(user_id)s")
        if query.project_id:
            where.append("c.project_id = %(project_id)s")
        if query.updated_after is not None:
            where.append("c.updated_at >= %(updated_after)s")
        if query.updated_before is not None:
            where.append("c.updated_at < %(updated_before)s")
        if query.after is not None:
            where.append(
                "(c.updated_at < %(after_updated_at)s"
                " OR (c.updated_at = %(after_updated_at)s AND c.task_id > %(after_task_id)s::uuid))"
            )
        sql = _LIST_WORKFLOWS + (" WHERE " + " AND ".join(where) if where else "") + _LIST_ORDER
        params: dict[str, Any] = {
            "statuses": list(query.statuses),
            "user_id": query.user_id,
            "project_id": query.project_id,
            "updated_after": query.updated_after,
            "updated_before": query.updated_before,
            "after_updated_at": query.after[0] if query.after else None,
            "after_task_id": query.after[1] if query.after else None,
            "limit": query.limit + 1,  # one more tells whether another page follows
        }

        async def read() -> Sequence[WorkflowListItem]:
            async with (
                self._pool.connection() as conn,
                conn.cursor(row_factory=dict_row) as cur,
            ):
                await cur.execute(sql, params)
                return [WorkflowListItem(**row) for row in await cur.fetchall()]

        rows = await with_retry(read)
        items = rows[: query.limit]
        more = len(rows) > query.limit
        last = items[-1] if items else None
        return WorkflowPage(
            items=items,
            next_after=(last.updated_at, last.task_id) if more and last else None,
        )


async def _select_workflow(
    conn: AsyncConnection[Any], task_id: str, *, lock: bool = False
) -> WorkflowRecord | None:
    query = _SELECT_WORKFLOW + (" FOR UPDATE OF c" if lock else "")
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(query, {"task_id": task_id})
        row = await cur.fetchone()
    return WorkflowRecord(**row) if row else None


async def _lock_workflow(conn: AsyncConnection[Any], task_id: str) -> WorkflowRecord:
    """Lock the task's lease row, then its workflow row (that order; see `_LOCK_LEASE`)."""
    await conn.execute(_LOCK_LEASE, {"task_id": task_id})
    record = await _select_workflow(conn, task_id, lock=True)
    if record is None:
        raise WorkflowNotFound(task_id)
    return record


async def _set_status(
    conn: AsyncConnection[Any], record: WorkflowRecord, status: str, error: str
) -> None:
    cur = await conn.execute(
        _SET_STATUS, {"task_id": record.task_id, "status": status, "error": error}
    )
    row = await cur.fetchone()
    assert row is not None
    await conn.execute(
        _INSERT_STATUS_EVENT,
        {"task_id": record.task_id, "seq": row[0], "run_id": record.run_id, "status": status},
    )
