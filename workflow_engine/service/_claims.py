"""Claiming a workflow for a run in this process, and making changes durable through the run
that holds its lease (`WorkflowService` extends this): one claim at a time per workflow here,
a closing run waited for, the run launched under its tenant's room (`domain.records.tenant_of`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from workflow_engine._clock import Clock
from workflow_engine.domain.records import (
    Fence,
    Lease,
    ResumeClaim,
    WorkflowRecord,
)
from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.errors import (
    InvalidState,
    RunEnded,
    ShuttingDown,
)
from workflow_engine.graph import changes as state_changes
from workflow_engine.graph import routing
from workflow_engine.graph.changes import Change
from workflow_engine.graph.state import (
    WorkflowState,
    state_or_empty,
)
from workflow_engine.runtime import EventHub, Run, RunManager
from workflow_engine.service._checks import (
    refuse_blocked,
    state_of,
)
from workflow_engine.service._outcomes import Applied
from workflow_engine.service._reads import WorkflowReads
from workflow_engine.storage import Pool, leases, on_connection, queries, workflow_rows

#: How long a change waits for a closing run of its workflow (one that wrote its last
#: checkpoint, or was told to stop) to end before claiming the workflow itself. Such a run has
#: no node left to run; this only bounds a run stuck on an unreachable database.
RUN_END_WAIT_SECONDS = 10.0


class WorkflowClaims(WorkflowReads):
    """The claims and the change path of `WorkflowService` (which sets these attributes)."""

    _pool: Pool
    _runs: RunManager
    _events: EventHub
    _process: str
    _clock: Clock
    _claim_locks: dict[str, tuple[asyncio.Lock, int]]

    def _check_accepting(self) -> None:
        if not self._runs.accepting:
            raise ShuttingDown("the engine is shutting down; send this to another replica")

    async def _apply(
        self,
        record: WorkflowRecord,
        holder: str,
        ttl: float,
        changes: Sequence[Change],
        tenant: str | None = None,
    ) -> Applied:
        """Make `changes` durable through whichever run holds the workflow's lease.

        A live run here takes them at once. A closing run (it wrote its last checkpoint, which
        released the lease, or it is stopping) is waited for, then the workflow is claimed and
        a new run applies them first (if its tenant has room for one more). Either way each
        change is computed from the state it is applied to, so a concurrent decision makes
        this one refused, never applied twice. `tenant`: the run's (`tenant_of`; None: its
        project's).
        """
        task_id = record.task_id
        for _ in range(3):
            run = await self._settled_run(task_id)
            if run is not None:
                done = run.submit(changes)
                if done is None:
                    continue  # it began closing just now; wait for it on the next pass
                try:
                    state = await done
                except RunEnded:
                    continue
                return await self._applied(task_id, None, state)
            launched = await self._claim_and_launch(record, holder, ttl, changes, tenant)
            if launched is None:
                continue  # a run of it started here meanwhile: submit to it on the next pass
            run, lease = launched
            state = await run.pending()[0]
            return await self._applied(task_id, lease, state)
        raise InvalidState("the workflow's run kept changing hands; nothing was changed, retry")

    async def _claim_and_launch(
        self,
        record: WorkflowRecord,
        holder: str,
        ttl: float,
        changes: Sequence[Change],
        tenant: str | None = None,
    ) -> tuple[Run, Lease] | None:
        """Claim the workflow and launch a run here that applies `changes` first; None when a
        run of it started here meanwhile. One claim at a time per workflow in this process:
        two changes that race here (a decision and the timer's expiry) would otherwise both
        take this holder's lease, each moving the other's epoch on."""
        task_id = record.task_id
        self._check_accepting()
        async with self._claim_lock(task_id):
            if self._runs.get(task_id) is not None:
                return None
            with self._runs.room_for(record.project_id if tenant is None else tenant):
                claim = await self._claim(task_id, holder, ttl)
                if claim.lease is None:
                    refuse_blocked(claim.record)
                    raise InvalidState(
                        f"the workflow has ended ({claim.record.status}); nothing was changed"
                    )
                try:  # refused by the state as claimed (it may have moved on): change nothing
                    state_changes.apply_all(changes, state_of(claim.record))
                except Exception:
                    await self._release(
                        Fence(task_id, claim.record.run_id, holder, claim.lease.epoch)
                    )
                    raise
                run = self._launch_resumed(
                    claim.record, holder, claim.lease, ttl, changes, tenant=tenant
                )
        return run, claim.lease

    @contextlib.asynccontextmanager
    async def _claim_lock(self, task_id: str) -> AsyncIterator[None]:
        """This process's lock on claiming `task_id`, kept only while someone wants it."""
        lock, users = self._claim_locks.get(task_id, (asyncio.Lock(), 0))
        self._claim_locks[task_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._claim_locks[task_id]
            if users == 1:
                del self._claim_locks[task_id]
            else:
                self._claim_locks[task_id] = (lock, users - 1)

    async def _claim(
        self, task_id: str, holder: str, ttl: float, max_recoveries: int | None = None
    ) -> ResumeClaim:
        """Take the lease of an unfinished workflow for a run in this process (see
        `workflow_rows.claim_for_resume`: a finished or blocked one comes back without it)."""
        return await workflow_rows.claim_for_resume(
            self._pool,
            process=self._process,
            task_id=task_id,
            holder_id=holder,
            ttl_seconds=ttl,
            max_recoveries=max_recoveries,
        )

    async def _release(self, fence: Fence) -> None:
        await on_connection(self._pool, lambda conn: leases.release(conn, fence))

    async def _settled_run(self, task_id: str) -> Run | None:
        """The run of `task_id` here that still takes changes; waits out a closing one."""
        run = self._runs.get(task_id)
        if run is None or not run.closing:
            return run
        if not await self._runs.wait(task_id, RUN_END_WAIT_SECONDS):
            raise InvalidState("the workflow's run here is still stopping; nothing was changed")
        return None

    async def _applied(self, task_id: str, lease: Lease | None, state: WorkflowState) -> Applied:
        record = await queries.get(self._pool, task_id)
        status = record.status
        if status == WorkflowStatus.RUNNING:  # not yet past the node the change leads to
            status = routing.committed_status(state, self._clock.now())
        return Applied(record, lease, status)

    def _launch_resumed(
        self,
        record: WorkflowRecord,
        holder: str,
        lease: Lease,
        ttl: float,
        changes: Sequence[Change] = (),
        *,
        tenant: str | None = None,
    ) -> Run:
        self._events.forget(task_id=record.task_id)  # others may have written since it ran here
        return self._runs.launch(
            fence=Fence(record.task_id, record.run_id, holder, lease.epoch),
            ttl_seconds=ttl,
            status=record.status,
            # Without a checkpoint the run died before its first node: start from the input.
            initial_input=None if record.has_checkpoint else state_or_empty(record.state),
            tenant=record.project_id if tenant is None else tenant,
            changes=changes,
        )
