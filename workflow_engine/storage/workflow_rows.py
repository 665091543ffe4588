"""Changes to a running or ended workflow's row: cancel, a runner's status change, a block,
an operator failing a blocked workflow, and why a run whose lease went elsewhere stopped.

Each public function is one transaction. Starting a workflow is `_workflow_start`'s, claiming
it again `_workflow_claims`' (both named here too, so that callers use one module for a row's
writes); the steps they share are `_row_writes`.
"""

from __future__ import annotations

from workflow_engine.domain.records import Fence, WorkflowRecord
from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.errors import InvalidState
from workflow_engine.storage import leases
from workflow_engine.storage._pool import Connection, Pool, in_transaction
from workflow_engine.storage._row_writes import (
    NOTIFY_CONTROL,
    insert_event,
    lock_workflow,
    write_block,
    write_status,
)
from workflow_engine.storage._workflow_claims import (
    claim_for_resume,
    count_unreadable,
    orphans,
    restart_from,
)
from workflow_engine.storage._workflow_start import create
from workflow_engine.storage.queries import select_workflow

__all__ = [
    "RELEASED_ELSEWHERE",
    "block",
    "cancel",
    "claim_for_resume",
    "count_unreadable",
    "create",
    "end_blocked",
    "note_stopped",
    "orphans",
    "restart_from",
    "set_status",
]

# An operator decided about a blocked workflow: one more event, nothing else yet.
_NOTE_OVERRIDE = """
UPDATE workflow_checkpoints SET event_seq = event_seq + 1
 WHERE task_id = %(task_id)s
RETURNING event_seq, status
"""

# Why a run whose lease is gone stopped, when another writer (not the engine) took it away:
# at the run's own epoch (an engine takeover or a cancel moves the epoch on), either released
# without the engine handing it over, or acquired under a lease id the engine did not write.
# The holder that took it, or NULL when it was released.
_STOPPED_BY = """
SELECT l.holder_id FROM task_workflow_leases AS l
 WHERE l.task_id = %(task_id)s AND l.epoch = %(epoch)s
   AND ((l.holder_id IS NULL AND NOT l.handed_over)
        OR l.lease_id IS DISTINCT FROM l.engine_lease_id)
   FOR UPDATE
"""

# Say so in the row (once; a resume clears it) while the workflow is still the engine's to run.
_NOTE_STOPPED = """
UPDATE workflow_checkpoints
   SET stopped_reason = %(reason)s, event_seq = event_seq + 1, updated_at = now()
 WHERE task_id = %(task_id)s AND engine_owned AND status = 'RUNNING'
   AND blocked_reason = '' AND stopped_reason = ''
RETURNING event_seq, status
"""

#: `stopped_reason` when the orchestrator released the lease of a running workflow.
RELEASED_ELSEWHERE = (
    "the lease was released by another holder (not this engine); "
    "ResumeWorkflow continues the workflow"
)


async def end_blocked(
    pool: Pool, task_id: str, error: str, actor: str, detail: str
) -> WorkflowRecord:
    """An operator fails a blocked workflow: FAILED with `error`, its state left as the other
    writer wrote it, the lease revoked; `InvalidState` when it is not blocked or has ended."""

    async def once(conn: Connection) -> WorkflowRecord:
        record = await lock_workflow(conn, task_id)
        if record.terminal or not record.blocked_reason:
            raise InvalidState("the workflow is not blocked; nothing was changed")
        cur = await conn.execute(_NOTE_OVERRIDE, {"task_id": task_id})
        row = await cur.fetchone()
        assert row is not None
        await insert_event(conn, record, row[0], "overridden", row[1], detail, actor)
        await write_status(conn, record, WorkflowStatus.FAILED, error)
        await leases.revoke(conn, task_id)
        await conn.execute(NOTIFY_CONTROL, {"task_id": task_id})
        updated = await select_workflow(conn, task_id)
        assert updated is not None
        return updated

    return await in_transaction(pool, once)


async def cancel(
    pool: Pool, task_id: str, reason: str, actor: str = ""
) -> tuple[WorkflowRecord, bool]:
    """Mark an unfinished workflow cancelled and revoke its lease; finished ones stay as is.
    `actor` (who cancelled) is recorded with the status event.

    Returns the record after the call, and whether this call cancelled it. The same
    transaction notifies every replica (``workflow_control``), so the one running it stops
    it and its jobs without waiting for its next lease renewal.
    """

    async def once(conn: Connection) -> tuple[WorkflowRecord, bool]:
        record = await lock_workflow(conn, task_id)
        if record.terminal:
            return record, False
        await write_status(conn, record, WorkflowStatus.CANCELLED, reason or "cancelled", actor)
        await leases.revoke(conn, task_id)
        await conn.execute(NOTIFY_CONTROL, {"task_id": task_id})
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
        await write_status(conn, record, status, error)
        return True

    return await in_transaction(pool, once)


async def note_stopped(pool: Pool, fence: Fence) -> str:
    """Record why the run of `fence` stopped, if another writer (not the engine) released or
    took its lease: `stopped_reason` and a ``stopped`` event. Returns the reason ('' when the
    lease went elsewhere in the engine, or was revoked by a cancel: nothing to say)."""

    async def once(conn: Connection) -> str:
        cur = await conn.execute(_STOPPED_BY, {"task_id": fence.task_id, "epoch": fence.epoch})
        row = await cur.fetchone()
        if row is None:
            return ""
        taker: str | None = row[0]
        reason = (
            RELEASED_ELSEWHERE
            if taker is None
            else f"the lease was taken by holder {taker!r} (not this engine)"
        )
        record = await select_workflow(conn, fence.task_id, lock=True)
        if record is None:
            return ""
        cur = await conn.execute(_NOTE_STOPPED, {"task_id": fence.task_id, "reason": reason})
        noted = await cur.fetchone()
        if noted is None:
            return ""
        await insert_event(conn, record, noted[0], "stopped", noted[1], reason, taker or "")
        return reason

    return await in_transaction(pool, once)


async def block(pool: Pool, fence: Fence, reason: str) -> bool:
    """Record, from a runner that still holds its lease, why the workflow must wait for an
    operator (its row was changed outside the engine); False when the fence no longer holds."""

    async def once(conn: Connection) -> bool:
        if not await leases.lock_fenced(conn, fence):
            return False
        record = await select_workflow(conn, fence.task_id, lock=True)
        if record is not None:
            await write_block(conn, record, reason)
        return record is not None

    return await in_transaction(pool, once)
