"""The engine's use cases: start, resume, get, cancel and watch a task's workflow.

The gRPC servicer translates messages to and from these calls; everything that decides what
happens lives here or below, so the same calls serve tests, benchmarks and other front ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from workflow_engine.config import Settings
from workflow_engine.errors import InvalidArgument, InvalidState, ShuttingDown
from workflow_engine.graph import commands
from workflow_engine.graph.commands import Decision, StateUpdate
from workflow_engine.graph.state import WorkflowState, initial_state
from workflow_engine.runtime.events import EventHub
from workflow_engine.runtime.manager import RunManager
from workflow_engine.runtime.run import Run
from workflow_engine.spec import Budget, TaskSpec, validate_task
from workflow_engine.storage.leases import Fence, Lease
from workflow_engine.storage.workflows import (
    MAX_HISTORY_EVENTS,
    TERMINAL_STATUSES,
    ResumeClaim,
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
        check_plannable: Callable[[TaskSpec], None],
        watch_poll_seconds: float = 1.0,
        update_wait_seconds: float = 30.0,
        on_task_stored: Callable[[str, TaskSpec], None] | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._runs = runs
        self._events = events
        self._watch_poll = watch_poll_seconds
        self._update_wait = update_wait_seconds
        self._on_task_stored = on_task_stored
        # The planner's up-front check (`Planner.check`): a task it cannot plan is refused at
        # start instead of being stored and FAILED by plan_steps.
        self._check_plannable = check_plannable

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
        self._check_plannable(task)
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
            assert outcome.lease is not None  # a started workflow holds the lease it took
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
        self,
        *,
        task_id: str,
        holder_id: str,
        lease_ttl_seconds: int = 0,
        decision: Decision | None = None,
        budget: Budget | None = None,
    ) -> ResumeOutcome:
        """Continue an unfinished workflow from its checkpoint under a fresh lease.

        A WAITING_FOR_APPROVAL workflow needs the `decision` that answers its request, and a
        SUSPENDED one a `budget` that raises the limit it hit; either is checked against the
        stored state before anything is written, and a decision nothing waits for is refused.
        """
        ttl = self._ttl(lease_ttl_seconds)
        holder = holder_id or self._settings.holder_id
        record = await self._store.get(task_id)
        # Refuse a wrong decision or budget before taking anything.
        self._updates_for(record, decision, budget, holder)
        if self._runs.is_live(task_id):
            return ResumeOutcome(record, None, resumed=False)
        self._check_accepting()
        claim = await self._claim_and_apply(
            task_id, holder, ttl, lambda record: self._updates_for(record, decision, budget, holder)
        )
        return ResumeOutcome(claim.record, claim.lease, resumed=claim.lease is not None)

    async def _claim_and_apply(
        self,
        task_id: str,
        holder: str,
        ttl: float,
        updates_for: Callable[[WorkflowRecord], list[StateUpdate]],
    ) -> ResumeClaim:
        """Take the lease, apply `updates_for(the claimed record)` and run on from there.

        The updates are computed again from the record as claimed (it may have moved on since
        the caller checked); if they no longer fit, the lease is released and nothing changes.
        Returns once they are durable.
        """
        claim = await self._store.claim_for_resume(
            task_id=task_id, holder_id=holder, ttl_seconds=ttl
        )
        if claim.lease is None:
            return claim
        fence = Fence(task_id, claim.record.run_id, holder, claim.lease.epoch)
        try:
            updates = updates_for(claim.record)
        except Exception:
            await self._store.release_lease(fence)
            raise
        run = self._launch_resumed(claim.record, holder, claim.lease, ttl, updates)
        await asyncio.gather(*run.pending_updates())
        return claim

    def _updates_for(
        self,
        record: WorkflowRecord,
        decision: Decision | None,
        budget: Budget | None,
        actor: str,
    ) -> list[StateUpdate]:
        # A tampered state is not validated here: the run refuses the checkpoint itself.
        state = _state_of(record)
        updates = []
        if record.status == "WAITING_FOR_APPROVAL" and decision is None:
            raise InvalidState(
                "decision: required; the workflow waits for approval of step "
                f"{(state.get('pending_approval') or {}).get('step_id')!r}"
            )
        if decision is not None:
            updates.append(commands.decide(state, decision))
        if budget is not None:
            if record.terminal:
                raise InvalidState(f"budget: the workflow has ended ({record.status})")
            updates.append(commands.raise_budget(state, budget, actor))
        elif record.status == "SUSPENDED":
            raise InvalidState(
                "budget: required; the workflow is SUSPENDED: " + (record.summary or "")
            )
        return updates

    async def update(
        self, task_id: str, change: Callable[[WorkflowState], StateUpdate]
    ) -> WorkflowRecord:
        """Apply an operator's override (`change` of the current state) under the lease.

        A run in this process applies it at its next node boundary; a workflow nobody runs is
        claimed, changed and continued here; one another replica runs is refused (its holder
        is named). `change` raises before anything is written when the override does not fit.
        """
        record = await self._store.get(task_id)
        if record.terminal:
            raise InvalidState(f"the workflow has ended ({record.status}); nothing to override")
        update = change(_state_of(record))
        run = self._runs.get(task_id)
        if run is not None:
            done = run.request_update(update)
            try:
                await asyncio.wait_for(asyncio.shield(done), self._update_wait)
            except TimeoutError:
                if run.withdraw_update(done):
                    raise InvalidState(
                        "the workflow did not reach a node boundary within "
                        f"{self._update_wait:g} s; nothing was changed, retry"
                    ) from None
                await done
            return await self._store.get(task_id)
        self._check_accepting()
        await self._claim_and_apply(
            task_id,
            self._settings.holder_id,
            float(self._settings.lease_ttl_seconds),
            lambda claimed: [change(_state_of(claimed))],
        )
        return await self._store.get(task_id)

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
        self,
        record: WorkflowRecord,
        holder: str,
        lease: Lease,
        ttl: float,
        updates: Sequence[StateUpdate] = (),
    ) -> Run:
        return self._runs.launch(
            fence=Fence(record.task_id, record.run_id, holder, lease.epoch),
            ttl_seconds=ttl,
            status=record.status,
            # Without a checkpoint the run died before its first node: start from the input.
            initial_input=None if record.has_checkpoint else record.state,  # type: ignore[arg-type]
            updates=updates if record.has_checkpoint else (),
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

    async def list_workflows(self, query: WorkflowQuery) -> WorkflowPage:
        """One page of workflows matching `query`, newest update first (no state, no history)."""
        return await self._store.list_workflows(query)


def _state_of(record: WorkflowRecord) -> WorkflowState:
    """The record's state; a tampered one (not an object) reads as empty, refused by the run."""
    return record.state if isinstance(record.state, dict) else {}  # type: ignore[return-value]
