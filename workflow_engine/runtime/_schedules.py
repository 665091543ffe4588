"""Firing schedules: every replica, every `timer_interval_seconds`, handles the due slots.

For each due, unpaused schedule the pass decides from the stored next fire time and the
engine's clock (`domain.schedules.decide`). To fire a slot it starts the slot's workflow
first, under a task id and idempotency key derived from the schedule and the slot
(`slot_task_id`), then moves the schedule on with a compare-and-set on its next fire time
(`storage.schedules.advance`). Two replicas that handle one slot meet at the start (one
starts it; the other is answered ALREADY_RUNNING, ALREADY_FINISHED, or refused because the
workflow exists or its lease is held) and at the compare-and-set (one moves it on); a replica
that dies between its start and its compare-and-set leaves the slot due, and the next pass
starts it again, which meets the workflow it started: each slot starts at most one workflow.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import structlog

from workflow_engine._clock import Clock
from workflow_engine.capabilities import TaskSource
from workflow_engine.domain.held import Held
from workflow_engine.domain.records import StartOutcome
from workflow_engine.domain.schedules import (
    CatchUp,
    Firing,
    Overlap,
    ScheduleRecord,
    decide,
    parse_calendar,
    slot_task,
    slot_task_id,
    to_datetime,
    to_instant,
)
from workflow_engine.domain.task import TaskSpec
from workflow_engine.errors import (
    InvalidState,
    LeaseHeld,
    ResourceExhausted,
    ShuttingDown,
    TaskSourceUnavailable,
    WorkflowEngineError,
    WorkflowExists,
)
from workflow_engine.runtime._periodic import Periodic
from workflow_engine.storage import Pool, schedules
from workflow_engine.telemetry import Metrics

log = structlog.get_logger(__name__)

#: Schedules one pass handles at most; the rest are due on the next pass.
BATCH = 100
#: Of which one tenant's (project's), at most: the others' slots are not queued behind its.
PER_TENANT = 20
#: How long passes leave out a schedule whose slot could not be handled (deferred, or an
#: error): a schedule stuck that way must not take a place in every pass.
BACKOFF_SECONDS = 5.0
#: What starts a slot's workflow: (task_id, task, (schedule_id, slot)) -> the start's answer.
Start = Callable[[str, TaskSpec, tuple[str, datetime]], Awaitable[StartOutcome]]
#: Errors that leave the slot due (the next pass tries again): nothing about the slot is wrong.
_TRY_AGAIN = (ShuttingDown, ResourceExhausted, TaskSourceUnavailable)


class Scheduler:
    """The firing loop of one replica (see the module docstring)."""

    def __init__(
        self,
        *,
        pool: Pool,
        start: Start,
        task_source: TaskSource,
        clock: Clock,
        interval_seconds: float,
        missed_after_seconds: float,
        metrics: Metrics | None = None,
    ) -> None:
        self._pool = pool
        self._start = start
        self._task_source = task_source
        self._clock = clock
        self._missed_after = missed_after_seconds
        self._metrics = Metrics() if metrics is None else metrics
        # Schedule id -> until when passes leave it out (see BACKOFF_SECONDS).
        self._backoff: dict[str, float] = {}
        self._loop = Periodic(
            "schedule_sweep", self.sweep, clock=clock, interval_seconds=interval_seconds
        )

    def start(self) -> None:
        self._loop.start()

    async def close(self) -> None:
        await self._loop.close()

    def held(self) -> list[Held]:
        """Schedules backed off from: each ends within `BACKOFF_SECONDS`."""
        return [Held("schedules.backed_off", len(self._backoff))]

    async def sweep(self) -> int:
        """Handle every due schedule once; return how many workflows this pass started."""
        now = self._clock.now()
        self._backoff = {sid: until for sid, until in self._backoff.items() if until > now}
        started = 0
        due = await schedules.due(
            self._pool,
            datetime.fromtimestamp(now, UTC),
            BATCH,
            per_tenant=PER_TENANT,
            skip=sorted(self._backoff),
        )
        for record in due:
            try:
                handled = await self._handle(record, now)
            except Exception as exc:  # one schedule's trouble must not stop the others'
                if isinstance(exc, WorkflowEngineError):
                    log.warning(
                        "schedule_failed", schedule_id=record.schedule_id, error=exc.message
                    )
                else:
                    log.exception("schedule_failed", schedule_id=record.schedule_id)
                handled = None
            if handled is None:
                self._backoff[record.schedule_id] = now + BACKOFF_SECONDS
            started += bool(handled)
        return started

    async def _handle(self, record: ScheduleRecord, now: float) -> bool | None:
        """Decide about one schedule's due slots and act on it; True if a workflow started,
        None if its slot was deferred (it stays due)."""
        stored_next = record.next_fire_time
        assert stored_next is not None  # the due query selects only schedules with one
        firing = decide(
            parse_calendar(record.cron, record.time_zone),
            to_instant(stored_next) or 0.0,
            now=now,
            missed_after=self._missed_after,
            catch_up=_catch_up(record.catch_up),
            overlap=_overlap(record.overlap),
            previous_unfinished=record.overlap != "ALLOW"
            and await schedules.unfinished(self._pool, record.last_task_id),
        )
        if firing is None:
            return False
        outcome: str = firing.outcome
        task_id = ""
        if outcome == "skipped":
            # Unless a replica started the slot's workflow and died before moving on: then
            # that workflow is the schedule's last run.
            own = slot_task_id(record.schedule_id, firing.handled)
            if await self._started_here(record, own, quiet=True):
                outcome, task_id = "taken", own
        if firing.slot is not None:
            task_id = slot_task_id(record.schedule_id, firing.slot)
            try:
                outcome = await self._fire(record, firing.slot, task_id)
                if outcome == "taken" and not await self._started_here(record, task_id):
                    outcome, task_id = "failed", ""
            except _TRY_AGAIN as exc:
                log.info("schedule_slot_deferred", schedule_id=record.schedule_id, why=exc.message)
                return None
            except WorkflowEngineError as exc:  # the template cannot start: the slot is lost
                log.warning(
                    "schedule_slot_failed", schedule_id=record.schedule_id, error=exc.message
                )
                outcome, task_id = "failed", ""
        moved = await _advance(self._pool, record, stored_next, firing, task_id)
        if not moved:
            log.info("schedule_moved_on_elsewhere", schedule_id=record.schedule_id)
        self._metrics.schedule_fired(outcome)
        return outcome == "started"

    async def _fire(self, record: ScheduleRecord, slot: float, task_id: str) -> str:
        """Start the slot's workflow: "started", or "taken" when another replica (or an
        earlier pass of this one) started it."""
        template = await self._template(record)
        task = slot_task(template, record.shown_id, slot)
        slot_at = to_datetime(slot)
        assert slot_at is not None
        try:
            answer = await self._start(task_id, task, (record.shown_id, slot_at))
        except (WorkflowExists, LeaseHeld):
            return "taken"
        return "started" if answer.status == "STARTED" else "taken"

    async def _started_here(
        self, record: ScheduleRecord, task_id: str, quiet: bool = False
    ) -> bool:
        """Whether a workflow of a slot's task id exists and is this schedule's. Anyone who
        knows a schedule's id can compute its slots' task ids and start a workflow under one
        first: such a workflow is never adopted as the schedule's last run (it would hold an
        overlap SKIP schedule off for as long as it waits); the slot is lost, and logged."""
        schedule_id, _slot = await schedules.started_by(self._pool, task_id)
        if schedule_id in (record.shown_id, record.schedule_id):  # an older engine: the key
            return True
        if not quiet or schedule_id is not None:
            log.warning(
                "schedule_slot_taken_by_another",
                schedule_id=record.schedule_id,
                task_id=task_id,
                error="a workflow this schedule did not start has the slot's task id",
            )
        return False

    async def _template(self, record: ScheduleRecord) -> TaskSpec:
        if record.task is not None:
            return TaskSpec.from_json(record.task)
        task = await self._task_source.load(record.template_task_id)
        # The schedule's scope was checked against this task when it was made; a task moved
        # to another project or user since must not start workflows there under it.
        owner = (task.metadata.project_id, task.metadata.user_id)
        if owner != (record.project_id, record.user_id):
            raise InvalidState(
                f"template_task_id: task {record.template_task_id} now belongs to project "
                f"{owner[0]!r}, user {owner[1]!r}, not the schedule's; the slot starts nothing"
            )
        return task


async def _advance(
    pool: Pool, record: ScheduleRecord, old: datetime, firing: Firing, task_id: str
) -> bool:
    handled = to_datetime(firing.handled)
    assert handled is not None
    return await schedules.advance(
        pool,
        record.schedule_id,
        old=old,
        next_fire_time=to_datetime(firing.next_fire_time),
        last_fire_time=handled,
        task_id=task_id,
    )


def _overlap(stored: str) -> Overlap:
    return "ALLOW" if stored == "ALLOW" else "SKIP"


def _catch_up(stored: str) -> CatchUp:
    return "RUN_ONCE" if stored == "RUN_ONCE" else "SKIP_MISSED"
