"""Writes to a task's workflow row: start, claim for resume, cancel, a runner's status change.

Each public function is one transaction. A request that is refused (lease held, workflow exists)
is decided inside the transaction and rolled back, so it changes nothing that is stored; a
refused start is then explained from one snapshot (`_explain_refused_start`). A claim made by
automatic recovery is counted here, and the claim over the cap fails the workflow. `orphans`
finds the RUNNING workflows that recovery claims.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from workflow_engine.domain.records import (
    Fence,
    Lease,
    ResumeClaim,
    StartOutcome,
    WorkflowRecord,
)
from workflow_engine.domain.status import (
    PAUSED_STATUSES,
    RECOVERY_EXHAUSTED,
    TERMINAL_STATUSES,
    WorkflowStatus,
)
from workflow_engine.domain.values import JsonObject
from workflow_engine.errors import (
    InvalidState,
    LeaseHeld,
    TaskNotFound,
    TaskNotStartable,
    WorkflowExists,
    WorkflowNotFound,
)
from workflow_engine.storage import leases, tasks
from workflow_engine.storage.pool import Connection, Pool, in_transaction, on_connection
from workflow_engine.storage.queries import select_workflow

# Every column the orchestrator's table has is given (its ORM creates it without defaults);
# the row is marked as the engine's.
# A start, in one statement: take the lease (no row when someone else holds it live), then
# with it insert the checkpoint row, store the task and append the first status event. An
# existing row is a unique violation, which rolls the whole statement back, lease included.
_START = (
    "WITH lease AS ("
    + leases.ACQUIRE
    + """
), cp AS (
    INSERT INTO workflow_checkpoints
        (id, task_id, state, last_node_id, updated_at, created_at, run_id, status, lease_epoch,
         idempotency_key, event_seq, user_id, project_id, engine_owned)
    SELECT gen_random_uuid(), %(task_id)s, %(state)s, NULL, now(), now(), %(run_id)s,
           'RUNNING', lease.epoch, %(idempotency_key)s, 1, %(user_id)s, %(project_id)s, true
      FROM lease
    RETURNING task_id
), task AS ("""
    + tasks.UPSERT_FROM.format(source="cp")
    + """), event AS (
    INSERT INTO workflow_events (task_id, seq, run_id, kind, node_id, status)
    SELECT task_id, 1, %(run_id)s, 'status', NULL, 'RUNNING' FROM cp
    RETURNING created_at
)
SELECT lease_id, holder_id, epoch, expires_at, event.created_at, holder_process
  FROM lease, event
"""
)

# Every transaction that touches both rows of a task locks the lease row first, as the
# checkpoint write does (FOR SHARE), so two of them never wait on each other in a cycle.
_LOCK_LEASE = "SELECT 1 FROM task_workflow_leases WHERE task_id = %(task_id)s FOR UPDATE"

# The engine's RUNNING workflows nobody is running: the engine handed their lease over (drain)
# or let it expire (crash). Not one the orchestrator released or took, and not a blocked one.
_ORPHANS = (
    """
SELECT c.task_id::text
  FROM workflow_checkpoints c
  JOIN task_workflow_leases l ON l.task_id = c.task_id
 WHERE c.status = 'RUNNING' AND c.engine_owned AND c.blocked_reason = '' AND """
    + leases.ORPHANED
    + """
 ORDER BY c.updated_at
 LIMIT %(limit)s
"""
)

# Tells every replica's event listener that a task's workflow was cancelled (see `EventHub`).
CONTROL_CHANNEL = "workflow_control"
_NOTIFY_CONTROL = "SELECT pg_notify('workflow_control', %(task_id)s::text)"

_SELECT_FOREIGN = (
    "SELECT 1 FROM workflow_checkpoints WHERE task_id = %(task_id)s AND NOT engine_owned"
)

_COUNT_RECOVERY = """
UPDATE workflow_checkpoints SET recovery_attempts = recovery_attempts + 1
 WHERE task_id = %(task_id)s
RETURNING recovery_attempts
"""

_INSERT_STATUS_EVENT = """
INSERT INTO workflow_events (task_id, seq, run_id, kind, node_id, status, actor)
VALUES (%(task_id)s, %(seq)s, %(run_id)s, 'status', NULL, %(status)s, %(actor)s)
"""

# The status column, and the state's status field with it, unless another writer changed the
# state (then it is left as they wrote it: the engine does not rewrite what is not its own).
# A status that ends the workflow also settles a block: an operator decided (cancel, fail),
# and the row as it now is counts as seen.
_SET_STATUS = """
WITH cur AS (
    SELECT task_id,
           NOT changed_outside AND jsonb_typeof(state) = 'object' AS ours,
           CASE WHEN jsonb_typeof(state) = 'object'  -- a hand-edited row may hold anything
                THEN jsonb_set(state, '{status}', to_jsonb(lower(%(status)s)))
                ELSE state END AS state
      FROM workflow_checkpoints
     WHERE task_id = %(task_id)s
)
UPDATE workflow_checkpoints c
   SET status = %(status)s,
       state = CASE WHEN cur.ours THEN cur.state ELSE c.state END,
       changed_outside = c.changed_outside AND NOT %(ends)s,
       blocked_reason = CASE WHEN %(ends)s THEN '' ELSE c.blocked_reason END,
       stopped_reason = CASE WHEN %(ends)s THEN '' ELSE c.stopped_reason END,
       error = CASE WHEN %(error)s = '' THEN c.error ELSE %(error)s END,
       event_seq = c.event_seq + 1,
       updated_at = now()
  FROM cur
 WHERE c.task_id = cur.task_id
RETURNING c.event_seq
"""

# Record why the engine will not run the workflow (once: the first detection writes the event).
_BLOCK = """
UPDATE workflow_checkpoints
   SET blocked_reason = %(reason)s, event_seq = event_seq + 1, updated_at = now()
 WHERE task_id = %(task_id)s AND blocked_reason = ''
RETURNING event_seq, status
"""

# An operator accepted the state another writer left: it becomes the engine's, to run from the
# start (no LangGraph bookkeeping, no last node), under the new lease's epoch.
_RESTART = """
UPDATE workflow_checkpoints
   SET state = %(state)s,
       last_node_id = NULL,
       checkpoint_id = NULL,
       checkpoint = NULL,
       checkpoint_metadata = NULL,
       status = 'RUNNING',
       lease_epoch = %(epoch)s,
       summary = '',
       error = '',
       blocked_reason = '',
       changed_outside = false,
       recovery_attempts = 0,
       event_seq = event_seq + 1,
       updated_at = now()
 WHERE task_id = %(task_id)s
RETURNING event_seq, status
"""

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

_CLEAR_STOPPED = "UPDATE workflow_checkpoints SET stopped_reason = '' WHERE task_id = %(task_id)s"

#: `stopped_reason` when the orchestrator released the lease of a running workflow.
RELEASED_ELSEWHERE = (
    "the lease was released by another holder (not this engine); "
    "ResumeWorkflow continues the workflow"
)

_INSERT_EVENT = """
INSERT INTO workflow_events (task_id, seq, run_id, kind, node_id, status, detail, actor)
VALUES (%(task_id)s, %(seq)s, %(run_id)s, %(kind)s, NULL, %(status)s, %(detail)s, %(actor)s)
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
    process: str,
    idempotency_key: str | None,
    ttl_seconds: float,
    spec: JsonObject,
    initial_state: JsonObject,
) -> StartOutcome:
    """Take the lease (for `holder_id`, in engine process `process`), store the task, its
    first checkpoint row and event: one statement."""
    lease_id = idempotency_key or str(uuid.uuid4())
    run_id = str(uuid.uuid4())
    metadata = spec.get("metadata") or {}
    params = {
        "task_id": task_id,
        "lease_id": lease_id,
        "holder_id": holder_id,
        "process": process,
        "ttl": ttl_seconds,
        "take_own": False,
        "state": Jsonb(initial_state),
        "run_id": run_id,
        "idempotency_key": idempotency_key,
        "user_id": str(metadata.get("user_id") or ""),
        "project_id": str(metadata.get("project_id") or ""),
        "spec": Jsonb(spec),
    }

    async def start(conn: Connection) -> tuple[Any, ...] | None:
        cur = await conn.execute(_START, params)
        return await cur.fetchone()

    for _ in range(3):  # a lease released between refusal and diagnosis is simply retried
        try:
            row = await on_connection(pool, start)
        except psycopg.errors.ForeignKeyViolation:
            # The orchestrator's schema ties its rows to `tasks.id`: the task is not there.
            raise TaskNotFound(task_id, "the orchestrator's tasks table") from None
        except psycopg.errors.UniqueViolation:
            row = None  # the workflow exists: the statement, lease and all, was rolled back
        if row is not None:
            lease = Lease(task_id, row[0], row[1], int(row[2]), row[3], True, row[5])
            return StartOutcome(
                status="STARTED",
                run_id=run_id,
                workflow_status=WorkflowStatus.RUNNING,
                lease=lease,
                started_at=row[4],
            )
        outcome = await _explain_refused_start(pool, task_id, holder_id, idempotency_key)
        if outcome is not None:
            return outcome
    raise LeaseHeld(task_id, None, None)


async def _explain_refused_start(
    pool: Pool, task_id: str, holder_id: str, idempotency_key: str | None
) -> StartOutcome | None:
    """Answer a start that could not store a workflow; `None` means try again.

    Decided from one snapshot of the lease and the workflow, in this order:
    - a row another writer created (not the engine's): TaskNotStartable;
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
        foreign = record is None and await _foreign_row(conn, task_id)
    if foreign:
        raise TaskNotStartable(
            task_id,
            "its workflow_checkpoints row was written by another writer (not this engine), "
            "which the engine leaves alone",
        )
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
        raise LeaseHeld(task_id, live.holder_id, live.expires_at, live.holder_process)
    if record is not None:
        raise WorkflowExists(task_id, record.status)
    return None


async def _foreign_row(conn: Connection, task_id: str) -> bool:
    cur = await conn.execute(_SELECT_FOREIGN, {"task_id": task_id})
    return await cur.fetchone() is not None


async def claim_for_resume(
    pool: Pool,
    *,
    task_id: str,
    holder_id: str,
    process: str,
    ttl_seconds: float,
    max_recoveries: int | None = None,
) -> ResumeClaim:
    """Take the lease of an unfinished workflow; a finished one is returned as it is.

    A workflow whose row another writer changed is not claimed either: the first claim that
    meets it records why (`blocked_reason`), and the claim comes back without a lease.

    With `max_recoveries`, this is an automatic recovery: it takes only a lease the engine
    handed over or let expire (see `leases.ORPHANED`), it is counted, and the claim that goes
    over the cap marks the workflow FAILED ("recovery attempts exhausted") instead.
    """
    try:
        return await in_transaction(
            pool,
            lambda conn: _claim_once(
                conn, task_id, holder_id, process, ttl_seconds, max_recoveries
            ),
        )
    except _Refused:
        raise await _lease_held(pool, task_id) from None


async def _lease_held(pool: Pool, task_id: str) -> LeaseHeld:
    """`LeaseHeld` naming whoever holds the task's lease now (a claim found it live)."""
    async with pool.connection() as conn:
        lease = await leases.current(conn, task_id)
    if lease is None:
        return LeaseHeld(task_id, None, None)
    return LeaseHeld(task_id, lease.holder_id, lease.expires_at, lease.holder_process)


async def _claim_once(
    conn: Connection,
    task_id: str,
    holder_id: str,
    process: str,
    ttl_seconds: float,
    max_recoveries: int | None,
) -> ResumeClaim:
    record = await _lock_workflow(conn, task_id)
    if record.terminal:
        return ResumeClaim(record=record, lease=None)
    if record.blocked_reason:
        await _block(conn, record, record.blocked_reason)
        return ResumeClaim(record=await _lock_workflow(conn, task_id), lease=None)
    lease = await leases.acquire(
        conn,
        task_id=task_id,
        lease_id=str(uuid.uuid4()),
        holder_id=holder_id,
        process=process,
        ttl_seconds=ttl_seconds,
        take_own=True,
        orphaned_only=max_recoveries is not None,
    )
    if lease is None:
        raise _Refused("lease")
    if record.stopped_reason:  # it runs again
        await conn.execute(_CLEAR_STOPPED, {"task_id": task_id})
        record = await _lock_workflow(conn, task_id)
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


async def restart_from(
    pool: Pool,
    *,
    task_id: str,
    holder_id: str,
    process: str,
    ttl_seconds: float,
    state: Callable[[JsonObject], JsonObject],
    actor: str,
    detail: str,
) -> ResumeClaim:
    """An operator accepts the state another writer left in a blocked workflow: take the lease,
    replace the row's state with `state(what they wrote)`, drop LangGraph's bookkeeping (the
    run starts again from that state, as a workflow that never ran a node), clear the block and
    record who decided. `InvalidState` when the workflow is not blocked or has ended."""

    async def once(conn: Connection) -> ResumeClaim:
        record = await _lock_workflow(conn, task_id)
        if record.terminal:
            raise InvalidState(f"the workflow has ended ({record.status}); nothing to accept")
        if not record.blocked_reason:
            raise InvalidState(
                "accept_outside_state: the workflow's row is as the engine wrote it; "
                "nothing to accept"
            )
        lease = await leases.acquire(
            conn,
            task_id=task_id,
            lease_id=str(uuid.uuid4()),
            holder_id=holder_id,
            process=process,
            ttl_seconds=ttl_seconds,
            take_own=True,
        )
        if lease is None:
            raise _Refused("lease")
        outside = record.state if isinstance(record.state, dict) else {}
        cur = await conn.execute(
            _RESTART,
            {"task_id": task_id, "state": Jsonb(state(outside)), "epoch": lease.epoch},
        )
        row = await cur.fetchone()
        assert row is not None
        await _insert_event(conn, record, row[0], "overridden", row[1], detail, actor)
        return ResumeClaim(record=await _lock_workflow(conn, task_id), lease=lease)

    try:
        return await in_transaction(pool, once)
    except _Refused:
        raise await _lease_held(pool, task_id) from None


async def end_blocked(
    pool: Pool, task_id: str, error: str, actor: str, detail: str
) -> WorkflowRecord:
    """An operator fails a blocked workflow: FAILED with `error`, its state left as the other
    writer wrote it, the lease revoked; `InvalidState` when it is not blocked or has ended."""

    async def once(conn: Connection) -> WorkflowRecord:
        record = await _lock_workflow(conn, task_id)
        if record.terminal or not record.blocked_reason:
            raise InvalidState("the workflow is not blocked; nothing was changed")
        cur = await conn.execute(_NOTE_OVERRIDE, {"task_id": task_id})
        row = await cur.fetchone()
        assert row is not None
        await _insert_event(conn, record, row[0], "overridden", row[1], detail, actor)
        await _set_status(conn, record, WorkflowStatus.FAILED, error)
        await leases.revoke(conn, task_id)
        await conn.execute(_NOTIFY_CONTROL, {"task_id": task_id})
        updated = await select_workflow(conn, task_id)
        assert updated is not None
        return updated

    return await in_transaction(pool, once)


async def orphans(pool: Pool, limit: int = 100) -> list[str]:
    """Task ids of RUNNING workflows whose lease was released or has expired."""

    async def read(conn: Connection) -> list[str]:
        cur = await conn.execute(_ORPHANS, {"limit": limit})
        return [row[0] for row in await cur.fetchall()]

    return await on_connection(pool, read)


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
        record = await _lock_workflow(conn, task_id)
        if record.terminal:
            return record, False
        await _set_status(conn, record, WorkflowStatus.CANCELLED, reason or "cancelled", actor)
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
        await _insert_event(conn, record, noted[0], "stopped", noted[1], reason, taker or "")
        return reason

    return await in_transaction(pool, once)


async def _lock_workflow(conn: Connection, task_id: str) -> WorkflowRecord:
    """Lock the task's lease row, then its workflow row (that order; see `_LOCK_LEASE`)."""
    await conn.execute(_LOCK_LEASE, {"task_id": task_id})
    record = await select_workflow(conn, task_id, lock=True)
    if record is None:
        raise WorkflowNotFound(task_id)
    return record


async def block(pool: Pool, fence: Fence, reason: str) -> bool:
    """Record, from a runner that still holds its lease, why the workflow must wait for an
    operator (its row was changed outside the engine); False when the fence no longer holds."""

    async def once(conn: Connection) -> bool:
        if not await leases.lock_fenced(conn, fence):
            return False
        record = await select_workflow(conn, fence.task_id, lock=True)
        if record is not None:
            await _block(conn, record, reason)
        return record is not None

    return await in_transaction(pool, once)


async def _block(conn: Connection, record: WorkflowRecord, reason: str) -> None:
    """Record `reason` as the row's `blocked_reason` and say so in its events (once)."""
    cur = await conn.execute(_BLOCK, {"task_id": record.task_id, "reason": reason})
    row = await cur.fetchone()
    if row is not None:
        await _insert_event(conn, record, row[0], "blocked", row[1], reason, "")


async def _insert_event(
    conn: Connection,
    record: WorkflowRecord,
    seq: int,
    kind: str,
    status: str,
    detail: str,
    actor: str,
) -> None:
    await conn.execute(
        _INSERT_EVENT,
        {
            "task_id": record.task_id,
            "seq": seq,
            "run_id": record.run_id,
            "kind": kind,
            "status": status,
            "detail": detail,
            "actor": actor,
        },
    )


async def _set_status(
    conn: Connection, record: WorkflowRecord, status: str, error: str, actor: str = ""
) -> None:
    cur = await conn.execute(
        _SET_STATUS,
        {
            "task_id": record.task_id,
            "status": status,
            "error": error,
            "ends": status in TERMINAL_STATUSES,
        },
    )
    row = await cur.fetchone()
    assert row is not None
    await conn.execute(
        _INSERT_STATUS_EVENT,
        {
            "task_id": record.task_id,
            "seq": row[0],
            "run_id": record.run_id,
            "status": status,
            "actor": actor,
        },
    )
