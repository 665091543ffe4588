"""The engine's use cases: start, resume, update, get, cancel and list a task's workflow.

The gRPC servicer translates messages to and from these calls; everything that decides what
happens lives here or below, so the same calls serve tests, benchmarks and other front ends.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import datetime

from workflow_engine._context import EngineContext
from workflow_engine._masking import step_secrets
from workflow_engine.capabilities import TaskSource
from workflow_engine.config import Settings
from workflow_engine.domain.deadlines import expiry_of
from workflow_engine.domain.held import Held
from workflow_engine.domain.records import (
    Fence,
    Scope,
    StartOutcome,
    WorkflowEventRecord,
    WorkflowRecord,
    tenant_of,
)
from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.domain.task import Budget, TaskSpec
from workflow_engine.errors import (
    InvalidState,
    LeaseHeld,
    OutOfScope,
    WorkflowExists,
)
from workflow_engine.graph import changes as state_changes
from workflow_engine.graph import jobs_in_flight
from workflow_engine.graph.changes import Decision, Override
from workflow_engine.graph.state import (
    WorkflowState,
    accepted_state,
    initial_state,
)
from workflow_engine.runtime import EventHub, RunManager
from workflow_engine.service._checks import (
    admits,
    in_scope,
    refuse_blocked,
    resume_changes,
    state_of,
)
from workflow_engine.service._claims import WorkflowClaims
from workflow_engine.service._outcomes import Applied, ResumeOutcome
from workflow_engine.service._task_by_id import check_inline_task_id, task_by_id
from workflow_engine.service._watch import Watches
from workflow_engine.storage import Pool, queries, workflow_rows

#: How long CancelWorkflow waits for the abandoned run here to end before it answers.
CANCEL_RUN_WAIT_SECONDS = 0.5


class WorkflowService(WorkflowClaims):
    """Start/resume/get/cancel/watch, on top of the store and this process's run manager (the
    reads, and the scope checks they share with the changes, are `WorkflowReads`'; claiming a
    workflow and applying changes through its lease, `WorkflowClaims`')."""

    def __init__(
        self,
        *,
        settings: Settings,
        pool: Pool,
        runs: RunManager,
        events: EventHub,
        check_startable: Callable[[TaskSpec], None],
        task_source: TaskSource,
        watch_poll_seconds: float = 1.0,
        on_task_stored: Callable[[str, TaskSpec], None] | None = None,
        context: EngineContext | None = None,
    ) -> None:
        context = EngineContext() if context is None else context
        self._secrets = context.secrets
        self._metrics = context.metrics
        self._clock = context.clock
        # Per workflow: one claim at a time in this process (see `_claim_and_launch`).
        self._claim_locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._settings = settings
        self._pool = pool
        # This process's name, recorded with every lease it takes (see `leases.acquire`).
        self._process = settings.process
        self._runs = runs
        self._events = events
        self._on_task_stored = on_task_stored
        # The planner's and the worker's up-front checks (`Capabilities.check_startable`): a
        # task that cannot be planned or run is refused at start, not stored and FAILED later.
        self._check_startable = check_startable
        # Where a StartWorkflow without a task loads it by id.
        self._task_source = task_source
        self._watches = Watches(
            pool=pool,
            runs=runs,
            events=events,
            poll_seconds=watch_poll_seconds,
            max_per_caller=settings.max_watches_per_caller,
            secrets=context.secrets,
        )
        # Yield the task's events from a sequence number on, ending after a terminal status;
        # with `kinds`, only events of those kinds and the terminal one; a `caller` (the
        # authenticated identity) with `max_watches_per_caller` open here is refused before
        # anything is read (see `Watches.stream`).
        self.watch = self._watches.stream

    def held(self) -> list[Held]:
        """Claims under way (each ends with its claim) and callers' open watches."""
        return [Held("claims.locks", len(self._claim_locks)), *self._watches.held()]

    def _ttl(self, requested: int) -> float:
        """The lease TTL a request asked for (checked by the API), or the configured one."""
        return float(requested or self._settings.lease_ttl_seconds)

    async def start(
        self,
        *,
        task_id: str,
        holder_id: str,
        idempotency_key: str | None,
        task: TaskSpec | None,
        lease_ttl_seconds: int = 0,
        scope: Scope | None = None,
        schedule: tuple[str, datetime] | None = None,
    ) -> StartOutcome:
        """Take the lease, store the task and the first checkpoint, and run in the background.

        `task` is valid (a `TaskSpec` checks itself), or `None`: then it is loaded by id from
        the task source, before anything is taken or stored. Whether it can be planned and run is
        asked here. `schedule` names the schedule and slot that start it (`runtime._schedules`).
        """
        if task is None:
            task = await task_by_id(self._pool, self._task_source, task_id, scope)
        elif not admits(scope, task.metadata.user_id, task.metadata.project_id):
            # The caller's own words (it chose the project and user): naming them tells nothing.
            raise OutOfScope(
                "task.metadata: the caller may not start workflows of project "
                f"{task.metadata.project_id!r}, user {task.metadata.user_id!r}",
                task_id=task_id,
            )
        else:
            await check_inline_task_id(self._task_source, task_id, scope)
        self._check_startable(task)
        ttl = self._ttl(lease_ttl_seconds)
        self._check_accepting()
        holder = holder_id or self._settings.holder_id
        run_id = str(uuid.uuid4())
        state = initial_state(task_id, run_id)
        tenant = tenant_of(scope, task.metadata.user_id, task.metadata.project_id)
        with self._runs.room_for(tenant):
            try:
                outcome = await workflow_rows.create(
                    self._pool,
                    process=self._process,
                    task_id=task_id,
                    run_id=run_id,
                    holder_id=holder,
                    idempotency_key=idempotency_key,
                    ttl_seconds=ttl,
                    spec=task.to_json(),
                    initial_state=dict(state),
                    schedule=schedule,
                )
            except (WorkflowExists, LeaseHeld):
                await self._taken_in_scope(task_id, scope)
                raise
            if outcome.status != "STARTED":
                await self._taken_in_scope(task_id, scope)
                return outcome
            assert outcome.lease is not None  # a started workflow holds the lease it took
            assert outcome.started_at is not None
            # Only a workflow stored adds its secrets: a refused start leaves the engine's
            # (every log line's) matcher as it was.
            self._secrets.add(step_secrets(task.steps))
            first = WorkflowEventRecord(
                1, "status", None, WorkflowStatus.RUNNING, outcome.started_at, outcome.run_id
            )
            self._events.started(task_id, first)
            self._metrics.workflow_started()
            if self._on_task_stored is not None:
                self._on_task_stored(task_id, task)
            self._runs.launch(
                fence=Fence(task_id, outcome.run_id, holder, outcome.lease.epoch),
                ttl_seconds=ttl,
                status=WorkflowStatus.RUNNING,
                initial_input=state,
                tenant=tenant,
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
        scope: Scope | None = None,
        actor: str = "",
    ) -> ResumeOutcome:
        """Continue an unfinished workflow from its checkpoint under a fresh lease.

        A WAITING_FOR_APPROVAL workflow needs the `decision` that answers its request, and a
        SUSPENDED one a `budget` that raises the limit it hit; either is checked against the
        stored state before anything is written, and a decision nothing waits for is refused.
        A decision or budget is applied exactly once, by whichever run holds the lease, or is
        refused with the reason; the answer says which status the workflow then has. A raised
        budget is recorded as `actor` (the authenticated caller), or else as the holder.
        """
        ttl = self._ttl(lease_ttl_seconds)
        holder = holder_id or self._settings.holder_id
        record = in_scope(await queries.get(self._pool, task_id), scope)
        refuse_blocked(record)
        tenant = tenant_of(scope, record.user_id, record.project_id)
        changes = resume_changes(record, decision, budget, actor or holder, self._clock)
        if changes:
            applied = await self._apply(record, holder, ttl, changes, tenant)
            return ResumeOutcome(applied.record, applied.lease, True, applied.status)
        run = await self._settled_run(task_id)
        if run is not None:  # already running here: nothing to do, and nothing dropped
            return ResumeOutcome(record, None, False, record.status)
        self._check_accepting()
        with self._runs.room_for(tenant):
            claim = await self._claim(task_id, holder, ttl)
            if claim.lease is None:
                refuse_blocked(claim.record)  # changed outside the engine since the read above
                return ResumeOutcome(claim.record, None, False, claim.record.status)
            self._launch_resumed(claim.record, holder, claim.lease, ttl, tenant=tenant)
        return ResumeOutcome(claim.record, claim.lease, True, claim.record.status)

    async def update(self, task_id: str, override: Override, scope: Scope | None = None) -> Applied:
        """Apply an operator's override under the lease.

        A change of the state (`override.change`): a run in this process applies it at once
        (interrupting its node); a workflow nobody runs is claimed, changed and continued here;
        one another replica runs is refused (its holder is named). The change raises before
        anything is written when it does not fit. A blocked workflow (another writer changed
        its row) takes only a decision about that: accept their state, or fail it.
        """
        record = in_scope(await queries.get(self._pool, task_id), scope)
        if record.terminal:
            raise InvalidState(f"the workflow has ended ({record.status}); nothing to override")
        tenant = tenant_of(scope, record.user_id, record.project_id)
        if override.accept_outside_state:
            return await self._accept_outside_state(record, override, tenant)
        if record.blocked_reason and override.fails:
            ended = await workflow_rows.end_blocked(
                self._pool,
                task_id,
                f"failed by {override.actor}"
                + (f": {override.reason}" if override.reason else "")
                + " (its state was changed outside the engine)",
                override.actor,
                "failed after a change outside the engine"
                + (f": {override.reason}" if override.reason else ""),
            )
            return Applied(ended, None, ended.status)
        refuse_blocked(record)
        assert override.change is not None
        changes = [override.change]
        state_changes.apply_all(changes, state_of(record))  # refuse early; applied below
        ttl = float(self._settings.lease_ttl_seconds)
        return await self._apply(record, self._settings.holder_id, ttl, changes, tenant)

    async def expire(self, task_id: str) -> str | None:
        """Apply the expiry of a waiting workflow's approval request (the timer sweep's call;
        see `runtime._deadlines`) through the same path as a person's decision; answer its
        action (reject, suspend).

        None, with nothing taken or written, when the row's state says it is not due (it waits
        on nothing, or on a request that has not expired: whatever the row's `wake_at` says).
        Otherwise the change is computed again from the state it is applied to, so a decision
        that got there first makes it refused (`InvalidState`), never applied twice.
        """
        record = await queries.get(self._pool, task_id)
        refuse_blocked(record)
        state = state_of(record)
        step_id = str((state.get("pending_approval") or {}).get("step_id") or "")

        def change(current: WorkflowState) -> state_changes.StateUpdate:
            return state_changes.expire(current, step_id, self._clock.now())

        expiry = expiry_of(state)
        try:
            change(state)
        except InvalidState:
            return None
        assert expiry is not None  # the change found it due
        ttl = float(self._settings.lease_ttl_seconds)
        await self._apply(record, self._settings.holder_id, ttl, [change])
        self._metrics.approval_expired(expiry.action)
        return expiry.action

    async def _accept_outside_state(
        self, record: WorkflowRecord, override: Override, tenant: str
    ) -> Applied:
        """Take what another writer left in a blocked workflow as the engine's, and run it from
        the start: the task is read again and re-planned (see `accepted_state`)."""
        if not record.blocked_reason:
            raise InvalidState(
                "accept_outside_state: the workflow's row is as the engine wrote it; "
                "nothing to accept"
            )
        self._check_accepting()
        holder = self._settings.holder_id
        ttl = float(self._settings.lease_ttl_seconds)
        run_id = str(uuid.uuid4())  # a new run: no job of the run before is its
        with self._runs.room_for(tenant):
            claim = await workflow_rows.restart_from(
                self._pool,
                process=self._process,
                task_id=record.task_id,
                run_id=run_id,
                holder_id=holder,
                ttl_seconds=ttl,
                state=lambda outside: dict(accepted_state(record.task_id, run_id, outside)),
                actor=override.actor,
                detail="accepted the state written outside the engine; re-planning"
                + (f": {override.reason}" if override.reason else ""),
            )
            assert claim.lease is not None
            self._launch_resumed(claim.record, holder, claim.lease, ttl, tenant=tenant)
        return Applied(claim.record, claim.lease, claim.record.status)

    async def recover(self, task_id: str) -> bool:
        """Adopt an orphaned workflow (automatic recovery); True if it now runs here."""
        if self._runs.is_live(task_id) or not self._runs.accepting:
            return False
        holder = self._settings.holder_id
        ttl = float(self._settings.lease_ttl_seconds)
        claim = await self._claim(task_id, holder, ttl, self._settings.recovery_max_attempts)
        if claim.lease is None:
            return False
        self._launch_resumed(claim.record, holder, claim.lease, ttl)
        self._metrics.recovery_adopted()
        return True

    async def cancel(
        self, task_id: str, reason: str, actor: str = "", scope: Scope | None = None
    ) -> WorkflowRecord:
        """Mark cancelled and revoke the lease; answers as soon as that is stored.

        Then, without making the caller wait: a run here is abandoned mid-node, and the jobs
        it had in flight are stopped (the replica running it elsewhere does the same when the
        cancel's notification reaches it).
        """
        await self._check_scope(task_id, scope)  # a workflow's owner never changes
        record, cancelled = await workflow_rows.cancel(self._pool, task_id, reason, actor)
        if cancelled:
            self._metrics.workflow_finished(
                WorkflowStatus.CANCELLED, record.state.get("started_at")
            )
            self._runs.cancel(task_id, jobs_in_flight(state_of(record)))
            # An abandoned run ends within milliseconds; this bound is for one stuck on an
            # unreachable database, which the answer does not wait for.
            await self._runs.wait(task_id, CANCEL_RUN_WAIT_SECONDS)
        return record
