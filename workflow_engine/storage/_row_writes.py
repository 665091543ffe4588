"""The steps every write to a task's workflow row is made of, inside its transaction.

Lock the lease row, then the workflow row (that order, always: `lock_workflow`); change the
status (`write_status`) or record a block (`write_block`), each with its event; refuse with
`Refused`, which rolls the transaction back, and explain the refusal with `lease_held`. The
writes themselves are `_workflow_start`, `_workflow_claims` and `workflow_rows`.
"""

from __future__ import annotations

from workflow_engine.domain.records import WorkflowRecord
from workflow_engine.domain.status import TERMINAL_STATUSES
from workflow_engine.errors import LeaseHeld, UnreadableStateFormat, WorkflowNotFound
from workflow_engine.storage import leases
from workflow_engine.storage._pool import Connection, Pool
from workflow_engine.storage.queries import select_workflow

# Every transaction that touches both rows of a task locks the lease row first, as the
# checkpoint write does (FOR SHARE), so two of them never wait on each other in a cycle.
_LOCK_LEASE = "SELECT 1 FROM task_workflow_leases WHERE task_id = %(task_id)s FOR UPDATE"

# Tells every replica's event listener that a task's workflow was cancelled (see `EventHub`).
CONTROL_CHANNEL = "workflow_control"
NOTIFY_CONTROL = "SELECT pg_notify('workflow_control', %(task_id)s::text)"

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
       -- Only a waiting row has a time to wake at (its checkpoint wrote it).
       wake_at = CASE WHEN %(status)s = 'WAITING_FOR_APPROVAL' THEN c.wake_at END,
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

_INSERT_EVENT = """
INSERT INTO workflow_events (task_id, seq, run_id, kind, node_id, status, detail, actor)
VALUES (%(task_id)s, %(seq)s, %(run_id)s, %(kind)s, NULL, %(status)s, %(detail)s, %(actor)s)
"""


class Refused(Exception):
    """Raised inside a transaction to roll it back; carries what to answer instead."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


async def lease_held(pool: Pool, task_id: str) -> LeaseHeld:
    """`LeaseHeld` naming whoever holds the task's lease now (a claim found it live)."""
    async with pool.connection() as conn:
        lease = await leases.current(conn, task_id)
    if lease is None:
        return LeaseHeld(task_id, None, None)
    return LeaseHeld(task_id, lease.holder_id, lease.expires_at, lease.holder_process)


async def lock_workflow(conn: Connection, task_id: str) -> WorkflowRecord:
    """Lock the task's lease row, then its workflow row (that order; see `_LOCK_LEASE`).

    Every change to a workflow's row starts here, so a row of a state format this engine does
    not read is refused here (`UnreadableStateFormat`), before anything is written."""
    await conn.execute(_LOCK_LEASE, {"task_id": task_id})
    record = await select_workflow(conn, task_id, lock=True)
    if record is None:
        raise WorkflowNotFound(task_id)
    if not record.readable:
        raise UnreadableStateFormat(task_id, record.blocked_reason)
    return record


async def write_block(conn: Connection, record: WorkflowRecord, reason: str) -> None:
    """Record `reason` as the row's `blocked_reason` and say so in its events (once)."""
    cur = await conn.execute(_BLOCK, {"task_id": record.task_id, "reason": reason})
    row = await cur.fetchone()
    if row is not None:
        await insert_event(conn, record, row[0], "blocked", row[1], reason, "")


async def insert_event(
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


async def write_status(
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
