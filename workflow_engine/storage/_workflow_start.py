"""Starting a workflow: the lease, the checkpoint row, the task and the first event in one
statement; a start that is refused (lease held, workflow exists) changes nothing, and is then
explained from one snapshot (`_explain_refused_start`).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from workflow_engine.domain.records import Lease, StartOutcome
from workflow_engine.domain.state_format import STATE_FORMAT
from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.domain.values import JsonObject
from workflow_engine.errors import (
    LeaseHeld,
    TaskNotFound,
    TaskNotStartable,
    UnreadableStateFormat,
    WorkflowExists,
)
from workflow_engine.storage import leases, tasks
from workflow_engine.storage._pool import Connection, Pool, on_connection
from workflow_engine.storage.queries import select_workflow
from workflow_engine.version import __version__

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
         idempotency_key, event_seq, user_id, project_id, engine_owned, state_format,
         engine_version, schedule_id, schedule_slot)
    SELECT gen_random_uuid(), %(task_id)s, %(state)s, NULL, now(), now(), %(run_id)s,
           'RUNNING', lease.epoch, %(idempotency_key)s, 1, %(user_id)s, %(project_id)s, true,
           %(state_format)s, %(engine_version)s, %(schedule_id)s, %(schedule_slot)s
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

_SELECT_FOREIGN = (
    "SELECT 1 FROM workflow_checkpoints WHERE task_id = %(task_id)s AND NOT engine_owned"
)


async def create(
    pool: Pool,
    *,
    task_id: str,
    run_id: str,
    holder_id: str,
    process: str,
    idempotency_key: str | None,
    ttl_seconds: float,
    spec: JsonObject,
    initial_state: JsonObject,
    schedule: tuple[str, datetime] | None = None,
) -> StartOutcome:
    """Take the lease (for `holder_id`, in engine process `process`), store the task, its
    first checkpoint row and event as run `run_id` (a new one: `initial_state` names it too):
    one statement. `schedule` (its id and the slot) is the
    schedule that starts it, if one does."""
    lease_id = idempotency_key or str(uuid.uuid4())
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
        "state_format": STATE_FORMAT,
        "engine_version": __version__,
        "schedule_id": schedule[0] if schedule else None,
        "schedule_slot": schedule[1] if schedule else None,
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
    if record is not None and not record.readable:
        raise UnreadableStateFormat(task_id, record.blocked_reason)
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
