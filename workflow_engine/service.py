"""The engine's use cases: start, resume, get, cancel and watch a task's workflow.

The gRPC servicer translates messages to and from these calls; everything that decides what
happens lives here or below, so the same calls serve tests, benchmarks and other front ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from workflow_engine.config import Settings
from workflow_engine.errors import InvalidArgument, ShuttingDown
from workflow_engine.graph.state import initial_state
from workflow_engine.runtime.events import EventHub
from workflow_engine.runtime.manager import RunManager
from workflow_engine.spec import TaskSpec, validate_task
from workflow_engine.storage.leases import Fence, Lease
from workflow_engine.storage.workflows import (
    MAX_HISTORY_EVENTS,
    TERMINAL_STATUSES,
    StartOutcome,
    WorkflowEventRecord,
    WorkflowPage,
    WorkflowQuery,
    WorkflowRecord,
    WorkflowStore,
)

MAX_LEASE_TTL_SECONDS = 24 * 3600
MIN_LEASE_TTL_SECONDS = 3


@dataclass(frozen=True, slots=True)
class ResumeOutcome:
    record: WorkflowRecord
    lease: Lease | None
    resumed: bool


class WorkflowService:
    """Start/resume/get/cancel/watch, on top of the store and this process's run manager."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: WorkflowStore,
        runs: RunManager,
        events: EventHub,
        watch_poll_seconds: float = 1.0,
        on_task_stored: Callable[[str, TaskSpec], None] | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._runs = runs
        self._events = events
        self._watch_poll = watch_poll_seconds
        self._on_task_stored = on_task_stored

    def _ttl(self, requested: int) -> float:
        if requested == 0:
            return float(self._settings.lease_ttl_seconds)
        if not MIN_LEASE_TTL_SECONDS <= requested <= MAX_LEASE_TTL_SECONDS:
            raise InvalidArgument(
                "lease_ttl_seconds",
                f"must be between {MIN_LEASE_TTL_SECONDS} and {MAX_LEASE_TTL_SECONDS}",
            )
        return float(requested)

    def _check_accepting(self) -> None:
        if not self._runs.accepting:
            raise ShuttingDown("the engine is shutting down; send this to another replica")

    async def start(
        self,
        *,
        task_id: str,
        holder_id: str,
        idempotency_key: str | None,
        task: TaskSpec,
        lease_ttl_seconds: int = 0,
    ) -> StartOutcome:
        """Validate, take the lease, store the first checkpoint, and run in the background."""
        validate_task(task)
        ttl = self._ttl(lease_ttl_seconds)
        self._check_accepting()
        holder = holder_id or self._settings.holder_id
        state = initial_state(task_id)
        outcome = await self._store.create(
            task_id=task_id,
            holder_id=holder,
            idempotency_key=idempotency_key,
            ttl_seconds=ttl,
            spec=task.to_json(),
            initial_state=dict(state),
        )
        if outcome.status == "STARTED":
            if self._on_task_stored is not None:
                self._on_task_stored(task_id, task)
            self._runs.launch(
                fence=Fence(task_id, outcome.run_id, holder, outcome.lease.epoch),
                ttl_seconds=ttl,
                status="RUNNING",
                initial_input=state,
            )
        return outcome

    async def resume(
        self, *, task_id: str, holder_id: str, lease_ttl_seconds: int = 0
    ) -> ResumeOutcome:
        """Continue an unfinished workflow from its checkpoint under a fresh lease."""
        ttl = self._ttl(lease_ttl_seconds)
        if self._runs.is_live(task_id):
            return ResumeOutcome(await self._store.get(task_id), None, resumed=False)
        self._check_accepting()
        holder = holder_id or self._settings.holder_id
        claim = await self._store.claim_for_resume(
            task_id=task_id, holder_id=holder, ttl_seconds=ttl
        )
        if claim.lease is None:
            return ResumeOutcome(claim.record, None, resumed=False)
        self._launch_resumed(claim.record, holder, claim.lease, ttl)
        return ResumeOutcome(claim.record, claim.lease, resumed=True)

    async def recover(self, task_id: str) -> bool:
        """Adopt an orphaned workflow (automatic recovery); True if it now runs here."""
        if self._runs.is_live(task_id) or not self._runs.accepting:
            return False
        holder = self._settings.holder_id
        ttl = float(self._settings.lease_ttl_seconds)
        claim = await self._store.claim_for_resume(
            task_id=task_id,
            holder_id=holder,
            ttl_seconds=ttl,
            max_recoveries=self._settings.recovery_max_attempts,
        )
        if claim.lease is None:
            return False
        self._launch_resumed(claim.record, holder, claim.lease, ttl)
        return True

    def _launch_resumed(
        self, record: WorkflowRecord, holder: str, lease: Lease, ttl: float
    ) -> None:
        self._runs.launch(
            fence=Fence(record.task_id, record.run_id, holder, lease.epoch),
            ttl_seconds=ttl,
            status=record.status,
            # Without a checkpoint the run died before its first node: start from the input.
            initial_input=None if record.has_checkpoint else record.state,  # type: ignore[arg-type]
        )

    async def get(self, task_id: str) -> WorkflowRecord:
        return await self._store.get(task_id)

    async def get_with_history(
        self, task_id: str
    ) -> tuple[WorkflowRecord, Sequence[WorkflowEventRecord]]:
        """The workflow and its events, oldest first (the newest `MAX_HISTORY_EVENTS` of them)."""
        return await self._store.get_with_history(task_id, MAX_HISTORY_EVENTS)

    async def cancel(
        self, task_id: str, reason: str, *, wait_seconds: float = 5.0
    ) -> WorkflowRecord:
        """Mark cancelled and revoke the lease; a run here stops at its next node boundary."""
        record = await self._store.cancel(task_id, reason)
        if self._runs.request_stop(task_id, "cancelled"):
            await self._runs.wait(task_id, wait_seconds)
        return record

    async def watch(self, task_id: str, from_sequence: int) -> AsyncIterator[WorkflowEventRecord]:
        """Yield the task's events from `from_sequence` on, ending after a terminal status."""
        next_seq = max(from_sequence, 1)
        with self._events.subscribe(task_id) as woken:
            record = await self._store.get(task_id)  # NOT_FOUND before anything is streamed
            while True:
                woken.clear()  # before reading, so a wake-up during the read is not lost
                batch = await self._store.events(task_id, next_seq)
                for event in batch:
                    yield event
                    next_seq = event.seq + 1
                    if event.kind == "status" and event.status in TERMINAL_STATUSES:
                        return
                if batch:
                    continue
                if record.terminal and next_seq > record.event_seq:
                    return
                try:
                    await asyncio.wait_for(woken.wait(), self._watch_poll)
                except TimeoutError:
                    record = await self._store.get(task_id)

    # Last in the class on purpose: below this method, `list` in an annotation would name it.
    async def list(self, query: WorkflowQuery) -> WorkflowPage:
        """One page of workflows matching `query`, newest update first (no state, no history)."""
        return await self._store.list(query)
