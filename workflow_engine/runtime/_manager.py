"""Owns every workflow run of this process: one asyncio task per run, and the runs' jobs.

It starts runs, applies changes through them, cancels them (the run is abandoned at once and
its jobs are stopped), and drains them on shutdown: every run stops at its next node boundary
with its checkpoint written and its lease released; runs still inside a node when the drain
time is up are cancelled (their node runs again on resume, and a job it had started is
re-attached by id, not run again).

It is also the jobs' gatekeeper: a job starts only within `FENCE_FRESH_SECONDS` of the database
confirming, under the run's fence, that the run holds the lease, so a workflow cancelled or
taken over elsewhere starts no job here. The confirmation is the run's own checkpoint write
when one just committed (a dispatch is written right before its job starts), otherwise a
check made for the job. A cancel in any replica stops the run at once (`cancel`) either way.

Each run is its tenant's (its task's project): the job tracker asks whose a job is
(`tenant_of`) to share its slots fairly, and `room_for` refuses a new run of a tenant that has
`max_runs_per_tenant` running here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

import psycopg
import structlog

from workflow_engine._context import EngineContext
from workflow_engine.capabilities import JobTracker
from workflow_engine.config import ENV_PREFIX
from workflow_engine.domain.held import Held
from workflow_engine.domain.jobs import JobRequest
from workflow_engine.domain.records import Fence, WorkflowEventRecord, tenant_shown
from workflow_engine.domain.status import TERMINAL_STATUSES, WorkflowStatus
from workflow_engine.errors import LeaseLost, RunStopped, WorkflowEngineError
from workflow_engine.graph import WorkflowGraph, jobs_in_flight
from workflow_engine.graph.changes import Change
from workflow_engine.graph.state import WorkflowState, state_or_empty
from workflow_engine.runtime._quotas import Quota
from workflow_engine.runtime._run import Run
from workflow_engine.storage import (
    Pool,
    RowCheckpointer,
    leases,
    on_connection,
    queries,
    workflow_rows,
)

log = structlog.get_logger(__name__)

#: How long a database confirmation that a run holds its lease admits its jobs: about what a
#: check of its own would leave between its answer and the job's start under load.
FENCE_FRESH_SECONDS = 0.05


def fence_fresh(confirmed_at: float | None, now: float) -> bool:
    """Whether the database's confirmation of a run's fence at `confirmed_at` (None: never)
    still admits a job at `now` (both the engine clock's monotonic time)."""
    return confirmed_at is not None and now - confirmed_at < FENCE_FRESH_SECONDS


def _nothing(task_id: str) -> None:
    """No one to tell that a run ended."""


class RunManager:
    """The live runs of this process, by task id."""

    def __init__(
        self,
        *,
        graph: WorkflowGraph,
        checkpoints: RowCheckpointer,
        pool: Pool,
        jobs: JobTracker,
        context: EngineContext | None = None,
        max_runs_per_tenant: int = 0,
    ) -> None:
        self._graph = graph
        self._checkpoints = checkpoints
        self._pool = pool
        self._jobs = jobs
        self._context = EngineContext() if context is None else context
        self._clock = self._context.clock
        self._runs: dict[str, tuple[Run, asyncio.Task[str]]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._accepting = True
        # Task id -> when (the clock's monotonic time) the database last confirmed its run's fence.
        self._confirmed: dict[str, float] = {}
        # Task id -> its tenant (its project, or a user: `domain.records.tenant_of`), while it
        # runs here; and each tenant's runs.
        self._tenants: dict[str, str] = {}
        self._tenant_runs = Quota(
            max_runs_per_tenant,
            setting=f"{ENV_PREFIX}MAX_RUNNING_WORKFLOWS_PER_TENANT",
            what="running workflows",
            shown=tenant_shown,
        )
        jobs.admit = self.admit
        jobs.tenant_of = self.tenant_of
        #: Told the task id of every run that ends here (the event hub drops its feed).
        self.on_run_ended: Callable[[str], None] = _nothing

    def __len__(self) -> int:
        return len(self._runs)

    def is_live(self, task_id: str) -> bool:
        return task_id in self._runs

    def get(self, task_id: str) -> Run | None:
        entry = self._runs.get(task_id)
        return entry[0] if entry else None

    @property
    def jobs(self) -> JobTracker:
        """The runs' job tracker (its slots show who runs and waits)."""
        return self._jobs

    def tenant_of(self, task_id: str) -> str:
        """The tenant (project) of the workflow `task_id` runs here ('' when none runs)."""
        return self._tenants.get(task_id, "")

    @contextmanager
    def room_for(self, tenant: str) -> Iterator[None]:
        """Hold room for one more run of `tenant` while the block claims and launches it;
        `ResourceExhausted` when the tenant has `max_runs_per_tenant` running (or starting)."""
        with self._tenant_runs.holding(tenant):
            yield

    @property
    def accepting(self) -> bool:
        return self._accepting

    def launch(
        self,
        *,
        fence: Fence,
        ttl_seconds: float,
        status: str,
        initial_input: WorkflowState | None,
        tenant: str,
        changes: Sequence[Change] = (),
    ) -> Run:
        """Start driving a workflow of `tenant` whose lease `fence` holds, applying `changes`
        first. A start or resume checks `room_for` the tenant before it claims the lease."""
        if self.get(fence.task_id) is not None:
            raise RuntimeError(f"task {fence.task_id} already has a run in this process")
        run = Run(
            fence=fence,
            ttl_seconds=ttl_seconds,
            status=status,
            graph=self._graph,
            checkpoints=self._checkpoints,
            pool=self._pool,
            initial_input=initial_input,
            context=self._context,
            changes=changes,
        )
        task = asyncio.create_task(self._execute(run), name=f"run-{fence.task_id}")
        self._runs[fence.task_id] = (run, task)
        self._tenants[fence.task_id] = tenant
        self._tenant_runs.add(tenant)
        self._context.metrics.lease("acquired")
        log.info("run_launched", task_id=fence.task_id, run_id=fence.run_id, epoch=fence.epoch)
        return run

    async def _execute(self, run: Run) -> str:
        task_id = run.fence.task_id
        try:
            outcome = await run.execute()
        finally:
            entry = self._runs.get(task_id)
            if entry is not None and entry[0] is run:
                del self._runs[task_id]
                self._confirmed.pop(task_id, None)
                self._tenant_runs.give_back(self._tenants.pop(task_id))
                self.on_run_ended(task_id)
            if run.status not in TERMINAL_STATUSES:
                self._jobs.forget(task_id)  # their results are for whoever resumes it
        if run.status in TERMINAL_STATUSES:
            await self._jobs.cancel(task_id)  # no job outlives its workflow (a forced end)
        if outcome.endswith("lease lost"):
            await self._after_lease_lost(run.fence)
        return outcome

    async def _after_lease_lost(self, fence: Fence) -> None:
        """A run stopped because its lease is gone. Released or taken by another writer (the
        orchestrator): say so in the row, for callers to see, and leave the jobs for whoever
        resumes it. Taken over by another replica: nothing to say. Revoked by a cancel
        elsewhere: stop its jobs."""
        task_id = fence.task_id
        try:
            reason = await workflow_rows.note_stopped(self._pool, fence)
            if reason:
                log.warning("run_stopped_by_another_writer", task_id=task_id, reason=reason)
                return
            record = await queries.get(self._pool, task_id)
        except (WorkflowEngineError, psycopg.Error) as exc:
            log.warning("run_end_status_unknown", task_id=task_id, error=repr(exc))
            return
        if record.status == WorkflowStatus.CANCELLED:
            # Named from the row: the run's end has already stopped waiting on them here.
            await self._jobs.cancel(task_id, jobs_in_flight(state_or_empty(record.state)))

    async def admit(self, job: JobRequest) -> None:
        """Let `job` start only while its run holds the lease (confirmed by the database)."""
        run = self.get(job.task_id)
        if run is None or run.closing:
            raise RunStopped(job.task_id, "the run is stopping; no new job starts")
        if fence_fresh(self._confirmed.get(job.task_id), self._clock.monotonic()):
            return
        fence = run.fence
        if not await on_connection(self._pool, lambda conn: leases.holds(conn, fence)):
            raise LeaseLost(job.task_id, run.fence.holder_id, run.fence.epoch)
        self._confirmed[job.task_id] = self._clock.monotonic()

    def held(self) -> list[Held]:
        """Every entry is a live run's (or a cancel's still stopping jobs)."""
        return [
            Held("runs.live", len(self._runs)),
            Held("runs.confirmed", len(self._confirmed)),
            Held("runs.tenants", len(self._tenants)),
            Held("runs.tenant_counts", self._tenant_runs.holders()),
            Held("runs.stopping", len(self._background)),
        ]

    def writing(self, task_id: str) -> None:
        """A run's checkpoint write is being sent (`WriteObserver`); nothing to do."""

    def written(self, task_id: str, events: Sequence[WorkflowEventRecord]) -> None:
        """A run's checkpoint write is over; appended events mean its fence held at commit."""
        if events and task_id in self._runs:
            self._confirmed[task_id] = self._clock.monotonic()

    def cancel(self, task_id: str, jobs: Iterable[tuple[str, JobRequest]] = ()) -> None:
        """The workflow was cancelled: abandon its run here, and stop its jobs (and `jobs`)."""
        run = self.get(task_id)
        if run is not None:
            run.request_stop("cancelled", interrupt=True)
        stopping = asyncio.create_task(self._jobs.cancel(task_id, jobs), name=f"cancel-{task_id}")
        self._background.add(stopping)
        stopping.add_done_callback(self._background.discard)

    async def wait(self, task_id: str, seconds: float | None) -> bool:
        """Wait for a live run to end; True if it did (or was not running) within `seconds`
        (None: however long it takes)."""
        entry = self._runs.get(task_id)
        if entry is None:
            return True
        done, _ = await asyncio.wait({entry[1]}, timeout=seconds)
        return bool(done)

    async def drain(self, seconds: float) -> None:
        """Stop accepting runs, stop every run at a node boundary, cancel stragglers."""
        self._accepting = False
        if self._background:
            await asyncio.wait(self._background, timeout=seconds)
        if not self._runs:
            return
        log.info("drain_started", runs=len(self._runs), seconds=seconds)
        for run, _ in self._runs.values():
            run.request_stop("shutdown")
        tasks = {task for _, task in self._runs.values()}
        _, pending = await asyncio.wait(tasks, timeout=seconds)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)
        log.info("drain_finished", cancelled_mid_node=len(pending))
