"""The engine in one object, and the one place it is assembled: database, pool, migrations,
capabilities, job tracker, graph, runs, events, use cases, recovery, deadlines, retention.

`Engine` runs in its caller's event loop, with or without the gRPC server in front of it:

    async with Engine(settings) as engine:
        result = await engine.run(TaskSpec(steps=[Step(id="hello", command=["echo", "hi"])]))

`workflow-engine serve` opens the same object and puts `serving.GrpcServer` in front of it.
Each part is built once, here, and handed to the parts that use it; `close` takes them down in
the order that keeps every run's checkpoint intact.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from types import TracebackType

import structlog

from workflow_engine._context import EngineContext
from workflow_engine._logs import mask_in_logs, unmask_in_logs
from workflow_engine.capabilities import (
    Capabilities,
    Lent,
    build_capabilities,
    check_choices,
    opened,
)
from workflow_engine.config import Settings
from workflow_engine.domain.held import Held
from workflow_engine.domain.records import StartOutcome, WorkflowEventRecord, WorkflowRecord
from workflow_engine.domain.status import TERMINAL_STATUSES, WorkflowStatus
from workflow_engine.domain.task import TaskSpec
from workflow_engine.errors import InvalidArgument
from workflow_engine.graph import build_graph, formats
from workflow_engine.graph.state import STATE_KEYS
from workflow_engine.runtime import (
    Census,
    Collector,
    DeadlineSweep,
    EventHub,
    Pruner,
    Recoverer,
    RunManager,
    Scheduler,
    remembered,
)
from workflow_engine.service import ScheduleService, WorkflowService
from workflow_engine.storage import (
    Pool,
    RowCheckpointer,
    database_url,
    open_pool,
    orchestrator_nodes,
    orchestrator_tasks,
    run_migrations,
    tasks,
)

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class WorkflowResult:
    """Where a workflow stands once this engine has stopped running it.

    `status` is final when the workflow ended (SUCCEEDED, FAILED, CANCELLED) or waits for a
    caller (WAITING_FOR_APPROVAL, SUSPENDED); RUNNING when it runs on elsewhere (another
    replica took it over, or this engine was closed first). `record` is its whole row.
    """

    task_id: str
    status: WorkflowStatus
    summary: str
    error: str
    record: WorkflowRecord

    @property
    def succeeded(self) -> bool:
        return self.status == WorkflowStatus.SUCCEEDED

    @property
    def ended(self) -> bool:
        """Whether nothing more can happen to it (SUCCEEDED, FAILED or CANCELLED)."""
        return self.status in TERMINAL_STATUSES


class WorkflowHandle:
    """A workflow of an open engine: await its run, read it, cancel it."""

    def __init__(self, engine: Engine, task_id: str, started: StartOutcome | None = None) -> None:
        self._engine = engine
        self.task_id = task_id
        #: How `Engine.start` was answered (STARTED, or ALREADY_RUNNING / ALREADY_FINISHED for
        #: an idempotency key seen before); None for a handle on an existing workflow.
        self.started = started

    async def wait(self) -> None:
        """Wait until this engine no longer runs the workflow: it ended, paused, or stopped
        here. Nothing is read; bound it with `asyncio.timeout` (the run goes on regardless)."""
        await self._engine.runs.wait(self.task_id, None)

    async def result(self) -> WorkflowResult:
        """`wait`, then read where the workflow stands."""
        await self.wait()
        record = await self.record()
        return WorkflowResult(
            self.task_id, WorkflowStatus(record.status), record.summary, record.error, record
        )

    def events(
        self, from_sequence: int = 1, kinds: frozenset[str] | None = None
    ) -> AsyncIterator[WorkflowEventRecord]:
        """Its events from `from_sequence` on, ending after the one that ends the workflow
        (SUCCEEDED, FAILED, CANCELLED); with `kinds` ("node", "status", ...), only those and
        that last one. A paused workflow's stream waits for it to go on."""
        return self._engine.service.watch(self.task_id, from_sequence, kinds=kinds)

    async def record(self) -> WorkflowRecord:
        """The workflow's row as it is now; `WorkflowNotFound` when there is none."""
        return await self._engine.service.get(self.task_id)

    async def cancel(self, reason: str = "", actor: str = "") -> WorkflowRecord:
        """Cancel it (see `WorkflowService.cancel`); the row after."""
        return await self._engine.service.cancel(self.task_id, reason, actor)


@dataclass(frozen=True, slots=True)
class _Parts:
    """What an open engine is made of, each built once (see `Engine._assemble`)."""

    pool: Pool
    checkpoints: RowCheckpointer
    runs: RunManager
    events: EventHub
    service: WorkflowService
    recoverer: Recoverer | None
    pruner: Pruner | None
    schedules: ScheduleService
    scheduler: Scheduler | None
    collector: Collector
    deadlines: DeadlineSweep
    census: Census


class Engine:
    """A workflow engine in this process's event loop; see the module docstring.

    `open` (or `async with`) starts it: the database (the embedded server when
    `settings.database_url` is empty), the schema, the capabilities the settings name (or
    `capabilities`, built by the caller with `build_capabilities` and changed as it likes), and
    recovery of orphaned workflows. `close` drains the runs (each stops at a node boundary
    with its checkpoint written) and closes everything it opened.
    """

    def __init__(self, settings: Settings, *, capabilities: Capabilities | None = None) -> None:
        self.settings = settings
        self._capabilities = capabilities
        #: What this engine owns and hands down: its secrets, metrics and fault plan. Given
        #: `capabilities`, it adopts theirs (build them with a `Lent` holding
        #: `EngineContext.for_settings`).
        self.context = (
            EngineContext.for_settings(settings) if capabilities is None else capabilities.context
        )
        self._parts: _Parts | None = None
        self._closed = False
        self._resources = AsyncExitStack()

    async def __aenter__(self) -> Engine:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # -- the public API -------------------------------------------------------------------

    async def start(
        self,
        task: TaskSpec,
        *,
        task_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> WorkflowHandle:
        """Store `task` and start its workflow in the background; errors as in
        `workflow_engine.errors` (`WorkflowExists`, `InvalidArgument`, ...).

        `task_id` (a UUID) defaults to a new one; an `idempotency_key` (a UUID) answers a start
        sent again with the workflow it started (see `StartOutcome`).
        """
        if self._closed:
            raise RuntimeError("the engine is closed")
        task_id = _uuid(task_id, "task_id") if task_id else str(uuid.uuid4())
        key = _uuid(idempotency_key, "idempotency_key") if idempotency_key else None
        outcome = await self.service.start(
            task_id=task_id, holder_id="", idempotency_key=key, task=task
        )
        return WorkflowHandle(self, task_id, outcome)

    async def run(
        self,
        task: TaskSpec,
        *,
        task_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> WorkflowResult:
        """`start` the workflow and await its `result` (bound it with `asyncio.timeout`)."""
        handle = await self.start(task, task_id=task_id, idempotency_key=idempotency_key)
        return await handle.result()

    def workflow(self, task_id: str) -> WorkflowHandle:
        """A handle on the workflow of `task_id` (started here or elsewhere)."""
        return WorkflowHandle(self, task_id)

    # -- its parts, for the gRPC server and white-box tests -------------------------------

    @property
    def service(self) -> WorkflowService:
        """The use cases (start, resume, update, cancel, get, list, watch)."""
        return self._opened().service

    @property
    def schedules(self) -> ScheduleService:
        """The schedule use cases (create, get, list, update, delete)."""
        return self._opened().schedules

    @property
    def runs(self) -> RunManager:
        return self._opened().runs

    @property
    def pool(self) -> Pool:
        return self._opened().pool

    def held(self) -> list[Held]:
        """What the engine holds in memory now, structure by structure (`domain.held`):
        with no workflow live here, nothing but its bounded caches' entries."""
        return self._opened().census.take()

    def _opened(self) -> _Parts:
        """The parts, once opened (and after `close`, closed as they are)."""
        if self._parts is None:
            raise RuntimeError("the engine is not open: use `async with Engine(settings)`")
        return self._parts

    # -- open and close -------------------------------------------------------------------

    async def open(self) -> Engine:
        """Start the engine (see the class docstring), and return it; on failure, nothing is
        left open."""
        if self._parts is not None:
            raise RuntimeError("the engine was opened already")
        settings = self.settings
        if self._capabilities is None:
            check_choices(settings)  # a bad setting is refused before anything starts
        context = self.context
        if settings.metrics_listen:
            context.metrics.enable()  # from the start: recovery may adopt runs at once
        mask_in_logs(context.secrets)
        self._resources.callback(unmask_in_logs, context.secrets)
        try:
            url = await self._resources.enter_async_context(database_url(settings))
            pool = await open_pool(url, settings)
            self._resources.push_async_callback(pool.close)
            applied = await run_migrations(pool)
            log.info("schema_ready", migrations=applied)
            # A bad configuration (a nodes file, no nodes table), or a stop during start-up,
            # ends the start cleanly.
            caps = self._capabilities or build_capabilities(settings, _lent(pool, context))
            await self._resources.enter_async_context(opened(caps))
        except BaseException:
            await self._resources.aclose()
            raise
        self._parts = self._assemble(url, pool, caps)
        return self

    def _assemble(self, url: str, pool: Pool, caps: Capabilities) -> _Parts:
        """Build the running parts on an open pool and opened capabilities (nothing here
        waits or fails on the database), and start the background ones."""
        settings, context = self.settings, self.context
        if context.faults:
            log.warning("fault_injection_enabled", faults=settings.faults)
        checkpoints = RowCheckpointer(
            pool, state_keys=STATE_KEYS, context=context, upgrade=formats.upgrade
        )
        runs = RunManager(
            graph=build_graph(caps),
            checkpoints=checkpoints,
            pool=pool,
            jobs=caps.jobs,
            context=context,
            max_runs_per_tenant=settings.max_running_workflows_per_tenant,
        )
        events = EventHub(settings.listen_url(url), on_control=runs.cancel)
        checkpoints.observe(events)
        checkpoints.observe(runs)
        runs.on_run_ended = events.release
        events.start()
        service = WorkflowService(
            watch_poll_seconds=settings.watch_poll_seconds,
            settings=settings,
            pool=pool,
            runs=runs,
            events=events,
            on_task_stored=caps.stored_tasks.stored,
            task_source=caps.task_source,
            check_startable=caps.check_startable,
            context=context,
        )
        recoverer = None
        if settings.recovery_enabled:
            recoverer = Recoverer(
                pool=pool,
                recover=service.recover,
                is_live=runs.is_live,
                interval_seconds=settings.recovery_interval_seconds,
                metrics=context.metrics,
                clock=context.clock,
            )
            recoverer.start()
        # Every replica applies the approval requests that expired (exactly once among them).
        deadlines = DeadlineSweep(
            pool=pool,
            expire=service.expire,
            clock=context.clock,
            interval_seconds=settings.timer_interval_seconds,
        )
        deadlines.start()
        pruner = None
        if settings.retention.days > 0:
            pruner = Pruner(
                pool=pool, settings=settings.retention, metrics=context.metrics, clock=context.clock
            )
            pruner.start()
        schedules, scheduler = self._schedules(pool, caps, service)
        # Everything built so far (modules, the compiled graph, pools) lives as long as the
        # engine: move it out of the collector's reach, so the full collections that workflow
        # churn triggers do not walk it again and again; and so on for the survivors of slow
        # full collections (in-flight runs), see `runtime._collector`.
        collector = Collector()
        collector.install()
        census = Census(
            [
                runs.held,
                caps.jobs.held,
                caps.worker.held,
                caps.stored_tasks.held,
                events.held,
                service.held,
                deadlines.held,
                *([scheduler.held] if scheduler is not None else []),
                remembered(context.secrets),
            ],
            metrics=context.metrics,
            clock=context.clock,
            interval_seconds=settings.timer_interval_seconds,
        )
        census.start()
        return _Parts(
            pool,
            checkpoints,
            runs,
            events,
            service,
            recoverer,
            pruner,
            schedules,
            scheduler,
            collector,
            deadlines,
            census,
        )

    def _schedules(
        self, pool: Pool, caps: Capabilities, service: WorkflowService
    ) -> tuple[ScheduleService, Scheduler | None]:
        """The schedule use cases, and (when `schedules_enabled`) the loop that fires them."""
        settings, context = self.settings, self.context
        schedules = ScheduleService(
            pool=pool,
            clock=context.clock,
            check_startable=caps.check_startable,
            task_source=caps.task_source,
        )
        if not settings.schedules_enabled:
            return schedules, None

        async def start(
            task_id: str, task: TaskSpec, schedule: tuple[str, datetime]
        ) -> StartOutcome:
            return await service.start(
                task_id=task_id,
                holder_id="",
                idempotency_key=task_id,
                task=task,
                schedule=schedule,
            )

        scheduler = Scheduler(
            pool=pool,
            start=start,
            task_source=caps.task_source,
            clock=context.clock,
            interval_seconds=settings.timer_interval_seconds,
            missed_after_seconds=settings.schedule_missed_after_seconds,
            metrics=context.metrics,
        )
        scheduler.start()
        return schedules, scheduler

    async def close(self, *, drain_timeout: float | None = None) -> None:
        """Drain the runs (see `RunManager.drain`), close connections, then the embedded server."""
        parts = self._parts
        if parts is None or self._closed:
            return
        self._closed = True
        timeout = self.settings.drain_timeout_seconds if drain_timeout is None else drain_timeout
        if parts.recoverer is not None:
            await parts.recoverer.close()
        if parts.pruner is not None:
            await parts.pruner.close()
        if parts.scheduler is not None:
            await parts.scheduler.close()
        await parts.deadlines.close()
        await parts.census.close()
        await parts.runs.drain(timeout)
        # The capabilities' resources, then the pool, then the embedded server: the reverse of
        # their opening. The checkpoint writer and the event feed go before the pool.
        await parts.checkpoints.close()
        await parts.events.close()
        await self._resources.aclose()
        parts.collector.uninstall()


def _uuid(value: str, field: str) -> str:
    """The canonical form of a UUID argument; `InvalidArgument` naming `field` otherwise."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidArgument(field, f"not a UUID: {value[:64]!r}") from None


def _lent(pool: Pool, context: EngineContext) -> Lent:
    """What the capabilities may read through the engine's pool (see `Lent`), and what the
    engine owns that they use (its secrets and metrics)."""
    return Lent(
        stored_task=partial(tasks.load, pool),
        orchestrator_task=partial(orchestrator_tasks.read_task, pool),
        has_orchestrator_tasks=partial(orchestrator_tasks.table_exists, pool),
        orchestrator_nodes=partial(orchestrator_nodes.read_nodes, pool),
        context=context,
    )
