"""Claiming a workflow to run it again: a resume, an automatic recovery (counted, and failed
over its cap) or an operator accepting the state another writer left; and `orphans`, the
RUNNING workflows that recovery claims.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from psycopg.types.json import Jsonb

from workflow_engine.domain.records import Fence, Lease, ResumeClaim
from workflow_engine.domain.state_format import FIRST_STATE_FORMAT, STATE_FORMAT
from workflow_engine.domain.status import (
    PAUSED_STATUSES,
    RECOVERY_EXHAUSTED,
    TERMINAL_STATUSES,
    WorkflowStatus,
)
from workflow_engine.domain.values import JsonObject
from workflow_engine.errors import InvalidState
from workflow_engine.storage import leases
from workflow_engine.storage._pool import Connection, Pool, in_transaction, on_connection
from workflow_engine.storage._row_writes import (
    Refused,
    insert_event,
    lease_held,
    lock_workflow,
    write_block,
    write_status,
)
from workflow_engine.version import __version__

# The engine's RUNNING workflows nobody is running: the engine handed their lease over (drain)
# or let it expire (crash). Not one the orchestrator released or took, and not a blocked one.
_ORPHANS = (
    """
SELECT c.task_id::text
  FROM workflow_checkpoints c
  JOIN task_workflow_leases l ON l.task_id = c.task_id
 WHERE c.status = 'RUNNING' AND c.engine_owned AND c.blocked_reason = ''
   AND c.state_format BETWEEN %(first_format)s AND %(state_format)s AND """
    + leases.ORPHANED
    + """
 ORDER BY c.updated_at
 LIMIT %(limit)s
"""
)

# The engine's unfinished workflows in a state format it does not read (a newer engine's).
_COUNT_UNREADABLE = """
SELECT count(*) FROM workflow_checkpoints
 WHERE status = ANY(%(unfinished)s) AND engine_owned
   AND state_format NOT BETWEEN %(first_format)s AND %(state_format)s
"""

_COUNT_RECOVERY = """
UPDATE workflow_checkpoints SET recovery_attempts = recovery_attempts + 1
 WHERE task_id = %(task_id)s
RETURNING recovery_attempts
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
       run_id = %(run_id)s,
       summary = '',
       error = '',
       blocked_reason = '',
       changed_outside = false,
       recovery_attempts = 0,
       wake_at = NULL,
       state_format = %(state_format)s,
       engine_version = %(engine_version)s,
       event_seq = event_seq + 1,
       updated_at = now()
 WHERE task_id = %(task_id)s
RETURNING event_seq, status
"""

_CLEAR_STOPPED = "UPDATE workflow_checkpoints SET stopped_reason = '' WHERE task_id = %(task_id)s"


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
    return await _claimed(
        pool,
        task_id,
        lambda conn: _claim_once(conn, task_id, holder_id, process, ttl_seconds, max_recoveries),
    )


async def _claim_once(
    conn: Connection,
    task_id: str,
    holder_id: str,
    process: str,
    ttl_seconds: float,
    max_recoveries: int | None,
) -> ResumeClaim:
    record = await lock_workflow(conn, task_id)
    if record.terminal:
        return ResumeClaim(record=record, lease=None)
    if record.blocked_reason:
        await write_block(conn, record, record.blocked_reason)
        return ResumeClaim(record=await lock_workflow(conn, task_id), lease=None)
    orphaned_only = max_recoveries is not None
    lease = await _take_lease(conn, task_id, holder_id, process, ttl_seconds, orphaned_only)
    if record.stopped_reason:  # it runs again
        await conn.execute(_CLEAR_STOPPED, {"task_id": task_id})
        record = await lock_workflow(conn, task_id)
    if max_recoveries is not None:
        cur = await conn.execute(_COUNT_RECOVERY, {"task_id": task_id})
        counted = await cur.fetchone()
        if counted is not None and counted[0] > max_recoveries:
            await write_status(conn, record, WorkflowStatus.FAILED, RECOVERY_EXHAUSTED)
            await leases.release(conn, Fence(task_id, record.run_id, holder_id, lease.epoch))
            return ResumeClaim(record=await lock_workflow(conn, task_id), lease=None)
    # A paused workflow keeps its status until the decision or budget that continues
    # it is written; anything else was interrupted and runs again.
    if record.status not in (WorkflowStatus.RUNNING, *PAUSED_STATUSES):
        await write_status(conn, record, WorkflowStatus.RUNNING, "")
        record = await lock_workflow(conn, task_id)
    return ResumeClaim(record=record, lease=lease)


async def restart_from(
    pool: Pool,
    *,
    task_id: str,
    run_id: str,
    holder_id: str,
    process: str,
    ttl_seconds: float,
    state: Callable[[JsonObject], JsonObject],
    actor: str,
    detail: str,
) -> ResumeClaim:
    """An operator accepts the state another writer left in a blocked workflow: take the lease,
    replace the row's state with `state(what they wrote)`, drop LangGraph's bookkeeping (the
    run starts again from that state, as a workflow that never ran a node, as run `run_id`),
    clear the block and record who decided. `InvalidState` when the workflow is not blocked or
    has ended."""

    async def once(conn: Connection) -> ResumeClaim:
        record = await lock_workflow(conn, task_id)
        if record.terminal:
            raise InvalidState(f"the workflow has ended ({record.status}); nothing to accept")
        if not record.blocked_reason:
            raise InvalidState(
                "accept_outside_state: the workflow's row is as the engine wrote it; "
                "nothing to accept"
            )
        lease = await _take_lease(conn, task_id, holder_id, process, ttl_seconds)
        outside = record.state if isinstance(record.state, dict) else {}
        cur = await conn.execute(
            _RESTART,
            {
                "task_id": task_id,
                "run_id": run_id,
                "state": Jsonb(state(outside)),
                "epoch": lease.epoch,
                "state_format": STATE_FORMAT,
                "engine_version": __version__,
            },
        )
        row = await cur.fetchone()
        assert row is not None
        await insert_event(conn, record, row[0], "overridden", row[1], detail, actor)
        return ResumeClaim(record=await lock_workflow(conn, task_id), lease=lease)

    return await _claimed(pool, task_id, once)


async def _claimed(
    pool: Pool, task_id: str, claim: Callable[[Connection], Awaitable[ResumeClaim]]
) -> ResumeClaim:
    """`claim` in one transaction; a lease someone else holds is refused with their name."""
    try:
        return await in_transaction(pool, claim)
    except Refused:
        raise await lease_held(pool, task_id) from None


async def _take_lease(
    conn: Connection,
    task_id: str,
    holder_id: str,
    process: str,
    ttl_seconds: float,
    orphaned_only: bool = False,
) -> Lease:
    """A new lease on the task for `holder_id` (its own live one included), or `Refused`."""
    lease = await leases.acquire(
        conn,
        task_id=task_id,
        lease_id=str(uuid.uuid4()),
        holder_id=holder_id,
        process=process,
        ttl_seconds=ttl_seconds,
        take_own=True,
        orphaned_only=orphaned_only,
    )
    if lease is None:
        raise Refused("lease")
    return lease


async def orphans(pool: Pool, limit: int = 100) -> list[str]:
    """Task ids of RUNNING workflows whose lease was released or has expired."""

    async def read(conn: Connection) -> list[str]:
        cur = await conn.execute(
            _ORPHANS,
            {"limit": limit, "first_format": FIRST_STATE_FORMAT, "state_format": STATE_FORMAT},
        )
        return [row[0] for row in await cur.fetchall()]

    return await on_connection(pool, read)


async def count_unreadable(pool: Pool) -> int:
    """How many of the engine's unfinished workflows are in a state format it does not read."""
    unfinished = sorted(set(WorkflowStatus) - TERMINAL_STATUSES)
    params = {
        "unfinished": unfinished,
        "first_format": FIRST_STATE_FORMAT,
        "state_format": STATE_FORMAT,
    }

    async def read(conn: Connection) -> int:
        cur = await conn.execute(_COUNT_UNREADABLE, params)
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    return await on_connection(pool, read)
