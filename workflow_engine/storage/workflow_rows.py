"""Writes to a task's workflow row: start, claim for resume, cancel, a runner's status change.

Each public function is one transaction. A request that is refused (lease held, workflow exists)
is decided inside the transaction and rolled back, so it changes nothing that is stored; a
refused start is then explained from one snapshot (`_explain_refused_start`). A claim made by
automatic recovery is counted here, and the claim over the cap fails the workflow. `orphans`
finds the RUNNING workflows that recovery claims.
"""

from __future__ import annotations

import uuid

from psycopg.types.json import Jsonb

from workflow_engine.domain.model import JsonObject
from workflow_engine.domain.records import Fence, ResumeClaim, StartOutcome, WorkflowRecord
from workflow_engine.domain.status import PAUSED_STATUSES, RECOVERY_EXHAUSTED, WorkflowStatus
from workflow_engine.errors import LeaseHeld, WorkflowExists, WorkflowNotFound
from workflow_engine.storage import leases, tasks
from workflow_engine.storage.pool import Connection, Pool, in_transaction, on_connection
from workflow_engine.storage.queries import select_workflow

_INSERT_WORKFLOW = """
INSERT INTO workflow_checkpoints
    (task_id, state, last_node_id, run_id, status, lease_epoch, idempotency_key, event_seq,
     user_id, project_id)
VALUES (%(task_id)s, %(state)s, NULL, %(run_id)s, 'RUNNING', %(epoch)s, %(idempotency_key)s, 1,
        %(user_id)s, %(project_id)s)
ON CONFLICT (task_id) DO NOTHING
RETURNING run_id
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


class _Refused(Exception):
    """Raised inside a transaction to roll it back; carries what to answer instead."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


async def create(
    pool: Pool,
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
            return await in_transaction(
                pool,
                lambda conn: _create_once(
                    conn,
                    task_id,
                    holder_id,
                    lease_id,
                    idempotency_key,
                    ttl_seconds,
                    spec,
                    initial_state,
                    run_id,
                ),
            )
        except _Refused:
            outcome = await _explain_refused_start(pool, task_id, holder_id, idempotency_key)
            if outcome is not None:
                return outcome
    raise LeaseHeld(task_id, None, None)


async def _create_once(
    conn: Connection,
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
    await tasks.store(conn, task_id, spec)
    await conn.execute(
        _INSERT_STATUS_EVENT,
        {"task_id": task_id, "seq": 1, "run_id": run_id, "status": WorkflowStatus.RUNNING},
    )
    return StartOutcome(
        status="STARTED", run_id=run_id, workflow_status=WorkflowStatus.RUNNING, lease=lease
    )


async def _explain_refused_start(
    pool: Pool, task_id: str, holder_id: str, idempotency_key: str | None
) -> StartOutcome | None:
    """Answer a start that could not store a workflow; `None` means try again.

    Decided from one snapshot of the lease and the workflow, in this order:
    - the workflow this key started: finished, ALREADY_FINISHED; not finished and no lease
      live, or the requesting holder's live lease, ALREADY_RUNNING (with its real status);
    - anyone else's live lease, or the holder's own under another key or none: LeaseHeld;
    - a workflow started under another key or none, with no lease live: WorkflowExists;
    - neither a live lease nor a workflow (the lease was released meanwhile): try again.
    """
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        lease = await leases.current(conn, task_id)
        record = await select_workflow(conn, task_id)
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
    pool: Pool,
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
        return await in_transaction(
            pool, lambda conn: _claim_once(conn, task_id, holder_id, ttl_seconds, max_recoveries)
        )
    except _Refused:
        async with pool.connection() as conn:
            lease = await leases.current(conn, task_id)
        raise LeaseHeld(
            task_id, lease.holder_id if lease else None, lease.expires_at if lease else None
        ) from None


async def _claim_once(
    conn: Connection,
    task_id: str,
    holder_id: str,
    ttl_seconds: float,
    max_recoveries: int | None,
) -> ResumeClaim:
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
            await _set_status(conn, record, WorkflowStatus.FAILED, RECOVERY_EXHAUSTED)
            await leases.release(conn, Fence(task_id, record.run_id, holder_id, lease.epoch))
            return ResumeClaim(record=await _lock_workflow(conn, task_id), lease=None)
    # A paused workflow keeps its status until the decision or budget that continues
    # it is written; anything else was interrupted and runs again.
    if record.status not in (WorkflowStatus.RUNNING, *PAUSED_STATUSES):
        await _set_status(conn, record, WorkflowStatus.RUNNING, "")
        record = await _lock_workflow(conn, task_id)
    return ResumeClaim(record=record, lease=lease)


async def orphans(pool: Pool, limit: int = 100) -> list[str]:
    """Task ids of RUNNING workflows whose lease was released or has expired."""

    async def read(conn: Connection) -> list[str]:
        cur = await conn.execute(_ORPHANS, {"limit": limit})
        return [row[0] for row in await cur.fetchall()]

    return await on_connection(pool, read)


async def cancel(pool: Pool, task_id: str, reason: str) -> tuple[WorkflowRecord, bool]:
    """Mark an unfinished workflow cancelled and revoke its lease; finished ones stay as is.

    Returns the record after the call, and whether this call cancelled it. The same
    transaction notifies every replica (``workflow_control``), so the one running it stops
    it and its jobs without waiting for its next lease renewal.
    """

    async def once(conn: Connection) -> tuple[WorkflowRecord, bool]:
        record = await _lock_workflow(conn, task_id)
        if record.terminal:
            return record, False
        await _set_status(conn, record, WorkflowStatus.CANCELLED, reason or "cancelled")
        await leases.revoke(conn, task_id)
        await conn.execute(_NOTIFY_CONTROL, {"task_id": task_id})
        updated = await select_workflow(conn, task_id)
        assert updated is not None
        return updated, True

    return await in_transaction(pool, once)


async def set_status(pool: Pool, fence: Fence, status: str, error: str = "") -> bool:
    """Set a status from a runner that still holds its lease; False when it does not."""

    async def once(conn: Connection) -> bool:
        if not await leases.lock_fenced(conn, fence):
            return False
        record = await select_workflow(conn, fence.task_id, lock=True)
        if record is None or record.status == status:
            return record is not None
        await _set_status(conn, record, status, error)
        return True

    return await in_transaction(pool, once)


async def _lock_workflow(conn: Connection, task_id: str) -> WorkflowRecord:
    """Lock the task's lease row, then its workflow row (that order; see `_LOCK_LEASE`)."""
    await conn.execute(_LOCK_LEASE, {"task_id": task_id})
    record = await select_workflow(conn, task_id, lock=True)
    if record is None:
        raise WorkflowNotFound(task_id)
    return record


async def _set_status(conn: Connection, record: WorkflowRecord, status: str, error: str) -> None:
    cur = await conn.execute(
        _SET_STATUS, {"task_id": record.task_id, "status": status, "error": error}
    )
    row = await cur.fetchone()
    assert row is not None
    await conn.execute(
        _INSERT_STATUS_EVENT,
        {"task_id": record.task_id, "seq": row[0], "run_id": record.run_id, "status": status},
    )
