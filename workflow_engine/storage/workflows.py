"""`WorkflowStore`: the one object through which the engine reads and writes workflow rows.

A facade and nothing more: each method is one call into the module that does the work and
holds its SQL. `workflow_rows` starts, claims, cancels and sets statuses; `queries` reads rows,
events and pages; `tasks` keeps the task spec; `leases` renews, releases and checks a runner's
lease on a pooled connection (`pool`). The service, the runtime and the task source hold this one
object built from the pool, instead of a pool and five modules, and tests build it from theirs.
The per-node checkpoint is not here: `checkpointer` writes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from workflow_engine.domain.records import (
    Fence,
    ResumeClaim,
    StartOutcome,
    WorkflowEventRecord,
    WorkflowPage,
    WorkflowQuery,
    WorkflowRecord,
)
from workflow_engine.domain.values import JsonObject
from workflow_engine.storage import leases, queries, tasks, workflow_rows
from workflow_engine.storage.pool import Pool, on_connection
from workflow_engine.storage.queries import MAX_HISTORY_EVENTS


class WorkflowStore:
    """The engine's reads and writes of workflow rows, outside the per-node checkpoint."""

    def __init__(self, pool: Pool, *, process: str = "") -> None:
        self._pool = pool
        # This engine process's name, recorded with every lease it takes (see `leases.acquire`).
        self._process = process

    # Writes: one transaction each (see `workflow_rows`).

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
        return await workflow_rows.create(
            self._pool,
            task_id=task_id,
            holder_id=holder_id,
            process=self._process,
            idempotency_key=idempotency_key,
            ttl_seconds=ttl_seconds,
            spec=spec,
            initial_state=initial_state,
        )

    async def claim_for_resume(
        self,
        *,
        task_id: str,
        holder_id: str,
        ttl_seconds: float,
        max_recoveries: int | None = None,
    ) -> ResumeClaim:
        """Take the lease of an unfinished workflow; a finished one is returned as it is."""
        return await workflow_rows.claim_for_resume(
            self._pool,
            task_id=task_id,
            holder_id=holder_id,
            process=self._process,
            ttl_seconds=ttl_seconds,
            max_recoveries=max_recoveries,
        )

    async def cancel(
        self, task_id: str, reason: str, actor: str = ""
    ) -> tuple[WorkflowRecord, bool]:
        """Cancel an unfinished workflow; the record after, and whether this call cancelled it."""
        return await workflow_rows.cancel(self._pool, task_id, reason, actor)

    async def set_status(self, fence: Fence, status: str, error: str = "") -> bool:
        """Set a status from a runner that still holds its lease; False when it does not."""
        return await workflow_rows.set_status(self._pool, fence, status, error)

    async def restart_from(
        self,
        *,
        task_id: str,
        holder_id: str,
        ttl_seconds: float,
        state: Callable[[JsonObject], JsonObject],
        actor: str,
        detail: str,
    ) -> ResumeClaim:
        """Accept the state another writer left in a blocked workflow; see `workflow_rows`."""
        return await workflow_rows.restart_from(
            self._pool,
            task_id=task_id,
            holder_id=holder_id,
            process=self._process,
            ttl_seconds=ttl_seconds,
            state=state,
            actor=actor,
            detail=detail,
        )

    async def end_blocked(
        self, task_id: str, error: str, actor: str, detail: str
    ) -> WorkflowRecord:
        """Fail a blocked workflow, leaving its state as the other writer wrote it."""
        return await workflow_rows.end_blocked(self._pool, task_id, error, actor, detail)

    async def block(self, fence: Fence, reason: str) -> bool:
        """Record why the workflow waits for an operator, from a runner holding its lease."""
        return await workflow_rows.block(self._pool, fence, reason)

    async def note_stopped(self, fence: Fence) -> str:
        """Record why a run that lost its lease stopped; see `workflow_rows.note_stopped`."""
        return await workflow_rows.note_stopped(self._pool, fence)

    async def orphans(self, limit: int = 100) -> list[str]:
        """Task ids of RUNNING workflows whose lease was released or has expired."""
        return await workflow_rows.orphans(self._pool, limit)

    # A runner's lease (see `leases`).

    async def fence_holds(self, fence: Fence) -> bool:
        """Whether `fence` still holds its lease (a read: nothing is locked or written)."""
        return await on_connection(self._pool, lambda conn: leases.holds(conn, fence))

    async def renew_lease(self, fence: Fence, ttl_seconds: float) -> datetime | None:
        """Extend the lease; `None` means it is lost. Retried for a third of the TTL at most."""
        return await on_connection(
            self._pool,
            lambda conn: leases.renew(conn, fence, ttl_seconds),
            max_seconds=ttl_seconds / 3,
        )

    async def release_lease(self, fence: Fence) -> bool:
        """Release the lease if `fence` still holds it; idempotent."""
        return await on_connection(self._pool, lambda conn: leases.release(conn, fence))

    # Reads (see `queries` and `tasks`).

    async def get(self, task_id: str) -> WorkflowRecord:
        return await queries.get(self._pool, task_id)

    async def get_with_history(
        self, task_id: str, limit: int = MAX_HISTORY_EVENTS
    ) -> tuple[WorkflowRecord, Sequence[WorkflowEventRecord]]:
        """The workflow and its newest `limit` events, oldest first, from one snapshot."""
        return await queries.get_with_history(self._pool, task_id, limit)

    async def events(
        self, task_id: str, from_seq: int, limit: int = 500
    ) -> list[WorkflowEventRecord]:
        return await queries.events(self._pool, task_id, from_seq, limit)

    async def list_workflows(self, query: WorkflowQuery) -> WorkflowPage:
        """One page of workflows matching `query`, newest update first."""
        return await queries.list_workflows(self._pool, query)

    async def load_task(self, task_id: str) -> JsonObject:
        return await tasks.load(self._pool, task_id)
