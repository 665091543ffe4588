"""The schedule use cases: create, get, list, update (pause, resume, calendar, template), delete.

A schedule is checked as the workflows it will start are: its calendar parses, its template is
a task StartWorkflow would accept from the same caller (in the caller's scope, startable by
the planner and the worker, with room for the two labels every slot adds), so a schedule that
is stored can fire. It belongs to its template's project and user, and is scoped like a
workflow: another tenant's schedule reads as one that does not exist. The firing itself is
`runtime._schedules`'.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from datetime import datetime

from workflow_engine._clock import Clock
from workflow_engine.capabilities import TaskSource
from workflow_engine.domain.records import Scope
from workflow_engine.domain.schedules import (
    Calendar,
    CatchUp,
    Overlap,
    ScheduleRecord,
    own_key,
    parse_calendar,
    slot_task,
    to_datetime,
)
from workflow_engine.domain.task import TaskSpec
from workflow_engine.errors import (
    InvalidArgument,
    InvalidState,
    OutOfScope,
    ScheduleExists,
    ScheduleNotFound,
)
from workflow_engine.service._checks import admits
from workflow_engine.service._task_by_id import task_by_id
from workflow_engine.storage import Pool, schedules
from workflow_engine.storage.schedules import SchedulePage

#: The fields UpdateSchedule's mask may name.
UPDATABLE = ("paused", "cron", "time_zone", "task", "template_task_id", "overlap", "catch_up")


@dataclass(frozen=True, slots=True)
class ScheduleDraft:
    """What a caller sets of a schedule (the API has checked each field's form)."""

    cron: str = ""
    time_zone: str = ""
    task: TaskSpec | None = None
    template_task_id: str = ""
    overlap: Overlap = "SKIP"
    catch_up: CatchUp = "SKIP_MISSED"
    paused: bool = False


class ScheduleService:
    """Schedules on top of the store; `check_startable` and `task_source` are the ones
    StartWorkflow uses, `clock` the engine's."""

    def __init__(
        self,
        *,
        pool: Pool,
        clock: Clock,
        check_startable: Callable[[TaskSpec], None],
        task_source: TaskSource,
    ) -> None:
        self._pool = pool
        self._clock = clock
        self._check_startable = check_startable
        self._task_source = task_source

    async def create(
        self, schedule_id: str | None, draft: ScheduleDraft, scope: Scope | None, actor: str
    ) -> ScheduleRecord:
        """Store a new schedule; `schedule_id` (canonical) defaults to a new UUID."""
        schedule_id = schedule_id or str(uuid.uuid4())
        owner = await self._owner(schedule_id, draft, scope)
        now = to_datetime(self._clock.now())  # stands in: the database sets both times
        assert now is not None
        record = ScheduleRecord(
            schedule_id=schedule_id,
            project_id=owner.metadata.project_id,
            user_id=owner.metadata.user_id,
            cron=draft.cron.strip(),
            time_zone=draft.time_zone,
            task=draft.task.to_json() if draft.task is not None else None,
            template_task_id=draft.template_task_id,
            overlap=draft.overlap,
            catch_up=draft.catch_up,
            paused=draft.paused,
            next_fire_time=None if draft.paused else await self._next(draft),
            last_fire_time=None,
            last_task_id="",
            created_by=actor,
            created_at=now,
            updated_at=now,
        )
        for _ in range(3):  # the schedule holding the id may be deleted between the two
            stored = await schedules.insert(self._pool, record)
            if stored is not None:
                return stored
            holders = await schedules.named(self._pool, schedule_id)
            if scope is None or any(_admits(scope, held) for held in holders):
                raise ScheduleExists(schedule_id)
            if holders:  # another tenant's: this one gets a key of its own (`own_key`)
                key = own_key(scope, schedule_id)
                stored = await schedules.insert(
                    self._pool, replace(record, schedule_id=key, public_id=schedule_id)
                )
                if stored is None:  # this caller's own, since moved out of its scope
                    raise ScheduleExists(schedule_id)
                return stored
        raise InvalidState("the schedule id kept changing hands while it was created; retry")

    async def get(self, schedule_id: str, scope: Scope | None) -> ScheduleRecord:
        """The schedule `scope` admits that callers name `schedule_id`: its own tenant's
        (a caller that sees several tenants meets the one keyed by the id first)."""
        for record in await schedules.named(self._pool, schedule_id):
            if _admits(scope, record):
                return record
        raise ScheduleNotFound(schedule_id)

    async def list(
        self, scope: Scope | None, limit: int, after: tuple[datetime, str] | None
    ) -> SchedulePage:
        return await schedules.list_page(self._pool, scope, limit, after)

    async def update(
        self, schedule_id: str, draft: ScheduleDraft, mask: Collection[str], scope: Scope | None
    ) -> ScheduleRecord:
        """Replace the fields `mask` names with `draft`'s; resuming (or a new calendar) sets
        the next slot from now, pausing clears it."""
        for _ in range(5):  # the firing loop may move the schedule on between read and write
            record = await self.get(schedule_id, scope)
            changed = _merged(record, draft, mask)
            if changed.task is None and not changed.template_task_id:
                raise InvalidArgument("schedule.task", "required: a task or a template_task_id")
            project_id, user_id = record.project_id, record.user_id
            if {"task", "template_task_id"} & set(mask):  # a new template: checked as new
                owner = (await self._owner(schedule_id, changed, scope)).metadata
                project_id, user_id = owner.project_id, owner.user_id
            else:
                await _calendar(changed)
            next_fire = record.next_fire_time
            if changed.paused:
                next_fire = None
            elif record.paused or {"cron", "time_zone"} & set(mask) or next_fire is None:
                next_fire = await self._next(changed)
            stored = await schedules.replace(
                self._pool,
                replace(
                    record,
                    project_id=project_id,
                    user_id=user_id,
                    cron=changed.cron.strip(),
                    time_zone=changed.time_zone,
                    task=changed.task.to_json() if changed.task is not None else None,
                    template_task_id=changed.template_task_id,
                    overlap=changed.overlap,
                    catch_up=changed.catch_up,
                    paused=changed.paused,
                    next_fire_time=next_fire,
                ),
            )
            if stored is not None:
                return stored
        raise InvalidState("the schedule kept changing while it was updated; retry")

    async def delete(self, schedule_id: str, scope: Scope | None) -> None:
        record = await self.get(schedule_id, scope)
        if not await schedules.delete(self._pool, record.schedule_id):
            raise ScheduleNotFound(schedule_id)

    async def _next(self, draft: ScheduleDraft) -> datetime | None:
        """The first slot of `draft`'s calendar after now, found off the event loop (a rare
        slot, such as a Monday the 29th of February, is years of cronsim's search away)."""
        return await asyncio.to_thread(_next_fire_time, draft, self._clock.now())

    async def _owner(self, schedule_id: str, draft: ScheduleDraft, scope: Scope | None) -> TaskSpec:
        """The template as it would start at a slot, checked as StartWorkflow checks a task:
        in the caller's scope and startable. Its metadata names the schedule's owner."""
        await _calendar(draft)
        if draft.task is not None and draft.template_task_id:
            raise InvalidArgument(
                "schedule.template_task_id", "either a task or a template_task_id, not both"
            )
        if draft.task is not None:
            task = draft.task
            if not admits(scope, task.metadata.user_id, task.metadata.project_id):
                raise OutOfScope(
                    "schedule.task.metadata: the caller may not start workflows of project "
                    f"{task.metadata.project_id!r}, user {task.metadata.user_id!r}"
                )
        elif draft.template_task_id:
            task = await task_by_id(self._pool, self._task_source, draft.template_task_id, scope)
        else:
            raise InvalidArgument("schedule.task", "required: a task or a template_task_id")
        self._check_startable(slot_task(task, schedule_id, 0.0))
        return task


def _admits(scope: Scope | None, record: ScheduleRecord) -> bool:
    return admits(scope, record.user_id, record.project_id)


async def _calendar(draft: ScheduleDraft) -> Calendar:
    """`draft`'s calendar, parsed in a worker thread: whether a cron names a time that ever
    comes is cronsim's search of up to 50 years (tens of ms for one that never does, e.g.
    ``0 0 */8 * 5#5``), which a request must not spend on the event loop."""
    return await asyncio.to_thread(parse_calendar, draft.cron, draft.time_zone)


def _next_fire_time(draft: ScheduleDraft, now: float) -> datetime | None:
    return to_datetime(parse_calendar(draft.cron, draft.time_zone).next_after(now))


def _merged(record: ScheduleRecord, draft: ScheduleDraft, mask: Collection[str]) -> ScheduleDraft:
    """The stored schedule with the masked fields of `draft`; a new template of one kind
    (a task, or a task id) drops the other unless the mask names both."""
    current = ScheduleDraft(
        cron=record.cron,
        time_zone=record.time_zone,
        task=TaskSpec.from_json(record.task) if record.task is not None else None,
        template_task_id=record.template_task_id,
        overlap="ALLOW" if record.overlap == "ALLOW" else "SKIP",
        catch_up="RUN_ONCE" if record.catch_up == "RUN_ONCE" else "SKIP_MISSED",
        paused=record.paused,
    )
    fields = {name: getattr(draft, name) for name in UPDATABLE if name in mask}
    if "task" in mask and draft.task is not None and "template_task_id" not in mask:
        fields["template_task_id"] = ""
    if "template_task_id" in mask and draft.template_task_id and "task" not in mask:
        fields["task"] = None
    return replace(current, **fields)
