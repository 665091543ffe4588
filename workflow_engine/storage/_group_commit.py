"""Group commit for checkpoint writes: many runs' node checkpoints in one fenced statement.

Each run still waits for its own row to commit before its next node starts, so nothing about
durability or fencing changes; what changes is that writes arriving while a batch is in
flight go together in the next one, so at high concurrency the database and this process pay
one round trip for many nodes. There is no artificial delay: a lone write is a batch of one.

A batch that fails with a non-transient error is retried row by row, so one bad row cannot
fail its neighbours.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import structlog
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from workflow_engine.domain.records import WorkflowEventRecord
from workflow_engine.domain.state_format import STATE_FORMAT
from workflow_engine.storage import leases
from workflow_engine.storage._retry import is_transient
from workflow_engine.telemetry import Metrics
from workflow_engine.version import __version__

log = structlog.get_logger(__name__)

# Lock the matching lease rows FOR SHARE (a takeover waits for this statement, or this statement
# sees the takeover), upsert the rows they fence, append each row's events, release the lease
# of a row that ends or pauses its workflow (so the moment the final status is visible, the task
# is free to claim: no window in which the row says "waiting" but the lease still says "held"),
# and say for every input row how it went (`Written`). A row counts as written when it was, or
# when the row already holds this very checkpoint at this epoch: a retry after a commit whose
# answer was lost (which may have released the lease) is not a lost lease. The rows
# arrive as one JSON array: psycopg would otherwise escape every JSON document into an array
# literal, which cost more CPU than the rest of the write.
WRITE_BATCH = (
    """
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s) AS i(
        task_id uuid, holder_id text, epoch bigint, run_id uuid, state jsonb, node text,
        status text, checkpoint_id text, checkpoint jsonb, metadata jsonb,
        summary text, error text, event_kind text, detail text, actor text, release boolean,
        wake_at double precision)
), events_of AS (
    -- How many events each row appends: its node's, and a status event when the status the
    -- row had before this statement differs.
    SELECT i.task_id,
           CASE WHEN old.status IS DISTINCT FROM i.status THEN 2 ELSE 1 END AS n_events
      FROM input i LEFT JOIN LATERAL (
           SELECT c.status FROM workflow_checkpoints c WHERE c.task_id = i.task_id LIMIT 1
      ) old ON true
), lease AS (
    -- The row's lease by its task id (one probe of the unique index per row, whatever the
    -- planner makes of the tables' statistics), locked, then fenced: a takeover that
    -- committed first is what the fence sees.
    SELECT l.task_id FROM input i CROSS JOIN LATERAL (
        SELECT l.task_id, l.holder_id, l.epoch, l.expires_at FROM task_workflow_leases l
         WHERE l.task_id = i.task_id LIMIT 1 FOR SHARE) l
     WHERE """
    + leases.fence_sql(holder="i.holder_id", epoch="i.epoch")
    + """
), cp AS (
    -- Every column the orchestrator's table has is given (its ORM creates it without
    -- defaults); the row is the engine's.
    INSERT INTO workflow_checkpoints AS c
        (id, task_id, state, last_node_id, updated_at, created_at, run_id, status, lease_epoch,
         checkpoint_id, checkpoint, checkpoint_metadata, event_seq, summary, error,
         engine_owned, state_format, engine_version, wake_at)
    SELECT gen_random_uuid(), i.task_id, i.state, i.node, now(), now(), i.run_id, i.status,
           i.epoch, i.checkpoint_id, i.checkpoint, i.metadata, n.n_events, i.summary, i.error,
           true, %(state_format)s, %(engine_version)s, to_timestamp(i.wake_at)
      FROM input i JOIN lease USING (task_id) JOIN events_of n USING (task_id)
    ON CONFLICT (task_id) DO UPDATE SET
        state = EXCLUDED.state,
        last_node_id = EXCLUDED.last_node_id,
        updated_at = now(),
        run_id = EXCLUDED.run_id,
        status = EXCLUDED.status,
        lease_epoch = EXCLUDED.lease_epoch,
        checkpoint_id = EXCLUDED.checkpoint_id,
        checkpoint = EXCLUDED.checkpoint,
        checkpoint_metadata = EXCLUDED.checkpoint_metadata,
        event_seq = c.event_seq + EXCLUDED.event_seq,
        summary = EXCLUDED.summary,
        error = EXCLUDED.error,
        recovery_attempts = 0,
        state_format = EXCLUDED.state_format,
        engine_version = EXCLUDED.engine_version,
        wake_at = EXCLUDED.wake_at
    -- A retry after a commit whose answer was lost must not append the events twice; and a
    -- row that is not the engine's, that another writer changed since the engine's last
    -- write, or that a newer engine wrote in a newer state format, is not overwritten (the
    -- answer says "outside").
    WHERE c.checkpoint_id IS DISTINCT FROM EXCLUDED.checkpoint_id
      AND c.engine_owned AND NOT c.changed_outside AND c.blocked_reason = ''
      AND c.state_format <= EXCLUDED.state_format
    RETURNING c.task_id, c.event_seq, c.updated_at
), released AS (
    UPDATE task_workflow_leases l
       SET holder_id = NULL, expires_at = NULL, updated_at = now()
      FROM input i JOIN cp USING (task_id)
     WHERE l.task_id = i.task_id AND i.release
), events AS (
    INSERT INTO workflow_events
        (task_id, seq, run_id, kind, node_id, status, created_at, detail, actor)
    SELECT cp.task_id, cp.event_seq - n.n_events + e.ord, i.run_id, e.kind, e.node, e.status,
           cp.updated_at, e.detail, e.actor
      FROM cp JOIN input i USING (task_id) JOIN events_of n USING (task_id)
     CROSS JOIN LATERAL unnest(
           (ARRAY[i.event_kind, 'status'])[1:n.n_events],
           (ARRAY[i.node, NULL])[1:n.n_events],
           (ARRAY[i.status, i.status])[1:n.n_events],
           (ARRAY[i.detail, ''])[1:n.n_events],
           (ARRAY[i.actor, i.actor])[1:n.n_events]
     ) WITH ORDINALITY AS e(kind, node, status, detail, actor, ord)
)
SELECT i.task_id::text,
       CASE WHEN cp.task_id IS NOT NULL OR w.task_id IS NOT NULL THEN 'written'
            WHEN lease.task_id IS NULL THEN 'lost'
            ELSE 'outside' END,
       cp.event_seq, n.n_events, cp.updated_at
  FROM input i
  LEFT JOIN lease USING (task_id)
  LEFT JOIN cp USING (task_id)
  LEFT JOIN events_of n USING (task_id)
  LEFT JOIN LATERAL (
       SELECT c.task_id FROM workflow_checkpoints c
        WHERE c.task_id = i.task_id AND c.checkpoint_id = i.checkpoint_id
          AND c.lease_epoch = i.epoch
        LIMIT 1
  ) w ON true
"""
)


#: How a row's write went: ``written`` (durable), ``lost`` (its lease no longer holds), or
#: ``outside`` (the lease holds, but the row is not the engine's to overwrite: another writer
#: changed it since the engine's last write, or it is blocked for that reason).
Written = Literal["written", "lost", "outside"]


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """How a row's write went, and the events it appended exactly as they are now stored.

    `events` is empty when the write appended none: it was not written, or it was a retry of a
    write that had already landed (its events are in the table, just not known here). Watchers
    in this process are served from these (see `runtime._events`), without reading them back.
    """

    written: Written
    events: tuple[WorkflowEventRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """One node's checkpoint write, as the batch statement takes it."""

    task_id: str
    holder_id: str
    epoch: int
    run_id: str
    state: dict[str, Any]
    node: str
    status: str
    checkpoint_id: str
    checkpoint: dict[str, Any]
    metadata: dict[str, Any]
    summary: str
    error: str
    #: The node's event: ``node`` for a completed node, ``overridden`` / ``approval_decided``
    #: for an operator's change; `detail` says what came of it and `actor` who caused it.
    event_kind: str = "node"
    detail: str = ""
    actor: str = ""
    #: Release the lease with this write: the row ends or pauses the workflow.
    release: bool = False
    #: When the timer sweep must look at the row again (epoch seconds): the expiry of the
    #: approval request a waiting workflow's state holds; None for every other row.
    wake_at: float | None = None


@dataclass
class _Pending:
    row: CheckpointRow
    done: asyncio.Future[WriteOutcome] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class GroupCommitter:
    """Batches `CheckpointRow` writes; `write` says how each went (`WriteOutcome`)."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        max_batch: int = 256,
        flushers: int = 2,
        metrics: Metrics | None = None,
    ) -> None:
        self._pool = pool
        self._metrics = Metrics() if metrics is None else metrics
        self._max_batch = max_batch
        self._flushers = flushers
        self._queue: asyncio.Queue[_Pending] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def write(self, row: CheckpointRow) -> WriteOutcome:
        """Write `row` durably (with whatever else is waiting), or say why it was not."""
        if self._queue is None:
            self._start()
        assert self._queue is not None
        pending = _Pending(row)
        await self._queue.put(pending)
        return await pending.done

    def _start(self) -> None:
        self._queue = asyncio.Queue()
        self._tasks = [
            asyncio.create_task(self._flush_forever(), name=f"group-commit-{i}")
            for i in range(self._flushers)
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._queue = None

    async def _flush_forever(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            batch = [await queue.get()]
            while len(batch) < self._max_batch and not queue.empty():
                batch.append(queue.get_nowait())
            await self._flush(batch)

    async def _flush(self, batch: list[_Pending]) -> None:
        started = time.perf_counter()
        try:
            outcomes = await self._execute([p.row for p in batch])
        except Exception as exc:
            if is_transient(exc) or len(batch) == 1:
                for p in batch:
                    if not p.done.done():
                        p.done.set_exception(exc)
                return
            log.warning("group_commit_split", rows=len(batch), error=repr(exc))
            for p in batch:  # isolate the row at fault
                await self._flush([p])
            return
        self._metrics.checkpoints_committed(len(batch), time.perf_counter() - started)
        for p in batch:
            if not p.done.done():
                p.done.set_result(outcomes.get(p.row.task_id, _LOST))

    async def _execute(self, rows: Sequence[CheckpointRow]) -> dict[str, WriteOutcome]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(WRITE_BATCH, batch_params(rows))
            answers = await cur.fetchall()
        by_task = {r.task_id: r for r in rows}
        return {
            task_id: WriteOutcome(written, _appended(by_task[task_id], seq, count, at))
            for task_id, written, seq, count, at in answers
        }


def batch_params(rows: Sequence[CheckpointRow]) -> dict[str, Any]:
    """`WRITE_BATCH`'s parameters for `rows`."""
    return {
        "rows": Jsonb(
            [
                {
                    "task_id": r.task_id,
                    "holder_id": r.holder_id,
                    "epoch": r.epoch,
                    "run_id": r.run_id,
                    "state": r.state,
                    "node": r.node,
                    "status": r.status,
                    "checkpoint_id": r.checkpoint_id,
                    "checkpoint": r.checkpoint,
                    "metadata": r.metadata,
                    "summary": r.summary,
                    "error": r.error,
                    "event_kind": r.event_kind,
                    "detail": r.detail,
                    "actor": r.actor,
                    "release": r.release,
                    "wake_at": r.wake_at,
                }
                for r in rows
            ]
        ),
        "state_format": STATE_FORMAT,
        "engine_version": __version__,
    }


_LOST = WriteOutcome("lost")


def _appended(
    row: CheckpointRow, last_seq: int | None, count: int | None, at: datetime | None
) -> tuple[WorkflowEventRecord, ...]:
    """The events `WRITE_BATCH` appended for `row` (none when it appended none)."""
    if last_seq is None or count is None or at is None:
        return ()
    first = last_seq - count + 1
    node_event = WorkflowEventRecord(
        first, row.event_kind, row.node, row.status, at, row.run_id, row.detail, row.actor
    )
    if count == 1:
        return (node_event,)
    status_event = WorkflowEventRecord(
        first + 1, "status", None, row.status, at, row.run_id, "", row.actor
    )
    return (node_event, status_event)
