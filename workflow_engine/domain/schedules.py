"""Schedules as values: a calendar's slots, and what a replica does about the slots that are due.

Pure: every function takes the instant it reasons about (`now`, seconds since the Unix epoch)
as an argument, so its unit tests pass the instants they want and never sleep. The firing loop
(`runtime._schedules`) reads the engine's clock and the stored schedule, and applies `decide`.

A calendar is either five cron fields (or a macro, which names five fields) read in an IANA
time zone, evaluated by `cronsim`, which follows Debian's cron across daylight-saving
changes: a slot in the hour that does not exist (spring forward) fires at the first minute
after the change, a slot in the hour that happens twice (fall back) fires once, at its first
occurrence. Or an interval, ``@every 30s``, whose slots are the whole multiples of the
interval since the Unix epoch (time zones do not apply).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from workflow_engine.domain.records import Scope
from workflow_engine.domain.task import TaskSpec
from workflow_engine.domain.values import JsonObject, parse
from workflow_engine.errors import InvalidArgument

MAX_CRON_CHARS = 256
MAX_TIME_ZONE_CHARS = 64
#: The longest interval `@every` accepts: a year (a longer calendar is a cron expression's).
MAX_INTERVAL_SECONDS = 366 * 86400
MACROS: dict[str, str] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_EVERY = re.compile(r"@every\s+([0-9]{1,9})([smh])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}
# An IANA name: letters, digits and - + _ in components joined by "/"; no "." at all, so no
# component can climb out of the zone database ("..") or name a file beside it.
_ZONE_NAME = re.compile(r"[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*")
#: How far back `latest_due` looks for the latest slot before it walks from the first due one.
_LOOK_BACK_SECONDS = 86400.0
#: How many of reverse iteration's latest slots `latest_at_or_before` checks before it walks.
_CANDIDATES = 4

Overlap = Literal["SKIP", "ALLOW"]
CatchUp = Literal["SKIP_MISSED", "RUN_ONCE"]
#: What became of a slot: a workflow started, or it was skipped (overlap), missed (catch-up).
Outcome = Literal["started", "skipped", "missed"]
#: Every slot's task id is uuid5(SLOT_NAMESPACE, "<schedule_id>/<slot as UTC ISO 8601>").
SLOT_NAMESPACE = uuid.UUID("6b0c2a4e-52a1-5c3e-9d7f-5c8e0a1d3e52")
#: Namespace of the keys of schedules whose id another tenant's holds (`own_key`).
SCHEDULE_KEY_NAMESPACE = uuid.UUID("0e3b7f52-8c1d-5a49-b6e2-4f9a1c7d2e80")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Calendar:
    """A schedule's slots: `cron` (five fields) in `zone`, or every `interval` seconds."""

    cron: str
    zone: tzinfo
    interval: int = 0

    def next_after(self, instant: float) -> float:
        """The first slot strictly after `instant`."""
        if self.interval:
            return float((math.floor(instant) // self.interval + 1) * self.interval)
        start = datetime.fromtimestamp(math.floor(instant), self.zone)
        try:
            return next(CronSim(self.cron, start)).timestamp()
        except StopIteration:  # no slot within cronsim's horizon
            return math.inf

    def latest_at_or_before(self, instant: float, first: float) -> float:
        """The latest slot at or before `instant`, given that `first` is a slot <= `instant`.

        A slot is one `next_after` names (forward iteration is the one that follows Debian's
        cron across daylight-saving changes). cronsim's reverse iteration proposes candidates
        cheaply, latest first, whatever the downtime; the first one forward iteration also
        names (the first slot at or after it) is walked forward to `instant`. That walk is a
        step or two, or the slots of about an hour when `instant` is in a repeated hour (reverse
        reads a fixed time's wall clock, and may propose the first occurrence's slots or the
        day before's). Only when no candidate checks out does this walk from `first`, or from
        a day back. The sweep calls this for every due schedule, on the event loop.
        """
        if self.interval:
            return float(math.floor(instant) // self.interval * self.interval)
        for candidate in itertools.islice(self._slots_back_from(instant), _CANDIDATES):
            if candidate < first:
                break
            slot = self.next_after(candidate - 1)
            if slot <= instant:
                return self._walk(slot, instant)
        if instant - first > _LOOK_BACK_SECONDS:  # skip most of a long downtime
            probe = self.next_after(instant - _LOOK_BACK_SECONDS)
            if probe <= instant:
                return self._walk(probe, instant)
        return self._walk(first, instant)

    def _slots_back_from(self, instant: float) -> Iterator[float]:
        """cronsim's reverse iteration from `instant`, inclusive, latest first."""
        start = datetime.fromtimestamp(math.floor(instant) + 1, self.zone)
        for slot in CronSim(self.cron, start, reverse=True):  # ends after 50 years without one
            yield slot.timestamp()

    def _walk(self, last: float, instant: float) -> float:
        """The latest slot <= `instant`, walking forward from the slot `last` with one CronSim."""
        start = datetime.fromtimestamp(math.floor(last), self.zone)
        for slot in CronSim(self.cron, start):
            following = slot.timestamp()
            if following > instant:
                break
            last = following
        return last


def parse_calendar(cron: str, time_zone: str) -> Calendar:
    """The calendar of a schedule's `cron` and `time_zone`; `InvalidArgument` naming
    ``schedule.cron`` or ``schedule.time_zone`` when either is malformed."""
    zone = parse_time_zone(time_zone)
    text = cron.strip()
    if len(cron) > MAX_CRON_CHARS:
        raise InvalidArgument("schedule.cron", f"longer than {MAX_CRON_CHARS} characters")
    if not text:
        raise InvalidArgument("schedule.cron", "required")
    if text.startswith("@every"):
        return Calendar(text, zone, _interval(text))
    fields = MACROS.get(text.lower(), text)
    if fields.startswith("@"):
        raise InvalidArgument(
            "schedule.cron",
            f"unknown macro {text[:32]!r}; expected @hourly, @daily, @weekly, @monthly, "
            "@yearly or @every <N>s|m|h",
        )
    if len(fields.split()) != 5:
        raise InvalidArgument(
            "schedule.cron", "expected five fields (minute hour day month weekday)"
        )
    try:
        CronSim(fields, datetime.now(UTC))
    except (CronSimError, ValueError, OverflowError) as exc:
        raise InvalidArgument("schedule.cron", f"not a cron expression: {exc}") from None
    calendar = Calendar(fields, zone)
    if calendar.next_after(datetime.now(UTC).timestamp()) == math.inf:
        raise InvalidArgument("schedule.cron", "names no time that ever comes")
    return calendar


def parse_time_zone(time_zone: str) -> tzinfo:
    """An IANA time zone name as a zone; empty is UTC."""
    if not time_zone:
        return UTC
    if len(time_zone) > MAX_TIME_ZONE_CHARS:
        raise InvalidArgument("schedule.time_zone", f"longer than {MAX_TIME_ZONE_CHARS} characters")
    if not _ZONE_NAME.fullmatch(time_zone):
        raise InvalidArgument("schedule.time_zone", "not an IANA time zone name")
    try:
        return ZoneInfo(time_zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidArgument(
            "schedule.time_zone",
            f"unknown time zone {time_zone!r} (an IANA name, e.g. Europe/Berlin)",
        ) from None


def _interval(text: str) -> int:
    match = _EVERY.fullmatch(text)
    if match is None:
        raise InvalidArgument(
            "schedule.cron", "expected @every <N>s, <N>m or <N>h, e.g. @every 30s"
        )
    seconds = int(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not 1 <= seconds <= MAX_INTERVAL_SECONDS:
        raise InvalidArgument(
            "schedule.cron", f"the interval must be from 1s to {MAX_INTERVAL_SECONDS // 86400} days"
        )
    return seconds


@dataclass(frozen=True, slots=True)
class Firing:
    """What one pass does about a schedule's due slots: start a workflow for `slot` (None:
    nothing starts), then record `handled` as the last slot and `next_fire_time` as the next."""

    slot: float | None
    handled: float
    next_fire_time: float
    outcome: Outcome


def decide(
    calendar: Calendar,
    next_fire_time: float,
    *,
    now: float,
    missed_after: float,
    catch_up: CatchUp,
    overlap: Overlap,
    previous_unfinished: bool,
) -> Firing | None:
    """The firing of the slots due at `now` (those <= now), or None when none is.

    The latest due slot L is on time when ``now - L <= missed_after``, else missed, and so
    is every earlier due slot: an on-time L fires, a missed one fires only with RUN_ONCE.
    With overlap SKIP, a slot that would fire while the schedule's previous workflow has not
    finished (`previous_unfinished`) starts nothing. Either way time moves on: the next fire
    time is the first slot after L.
    """
    if next_fire_time > now:
        return None
    latest = calendar.latest_at_or_before(now, next_fire_time)
    following = calendar.next_after(latest)
    if now - latest > missed_after and catch_up == "SKIP_MISSED":
        return Firing(None, latest, following, "missed")
    if overlap == "SKIP" and previous_unfinished:
        return Firing(None, latest, following, "skipped")
    return Firing(latest, latest, following, "started")


def slot_text(slot: float) -> str:
    """A slot as UTC ISO 8601 to the second (``2026-11-27T21:00:00Z``)."""
    return datetime.fromtimestamp(math.floor(slot), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def slot_task_id(schedule_id: str, slot: float) -> str:
    """The task id (and idempotency key) of the workflow `schedule_id` starts for `slot`."""
    return str(uuid.uuid5(SLOT_NAMESPACE, f"{schedule_id}/{slot_text(slot)}"))


def own_key(scope: Scope, schedule_id: str) -> str:
    """The key of a schedule that a caller in `scope` creates under `schedule_id` while
    another tenant's schedule holds that id: schedule ids are a space per tenant, so that
    creating one answers alike whether its id is unknown or another tenant's. Its slots'
    task ids derive from this key (`slot_task_id`), so they meet no other tenant's."""
    space = json.dumps([sorted(scope.projects), sorted(scope.users)])
    return str(uuid.uuid5(SCHEDULE_KEY_NAMESPACE, f"{space}/{schedule_id}"))


def slot_task(task: TaskSpec, schedule_id: str, slot: float) -> TaskSpec:
    """The template as one slot's task: its metadata labels gain `schedule_id` and
    `schedule_slot` (UTC ISO 8601); refused, naming the field, when no room is left."""
    data = task.to_json()
    metadata = dict(data.get("metadata") or {})
    metadata["labels"] = {
        **dict(metadata.get("labels") or {}),
        "schedule_id": schedule_id,
        "schedule_slot": slot_text(slot),
    }
    data["metadata"] = metadata
    slotted: TaskSpec = parse(TaskSpec, data, "schedule.task")
    return slotted


def to_instant(value: datetime | None) -> float | None:
    return None if value is None else (value - _EPOCH).total_seconds()


def to_datetime(instant: float | None) -> datetime | None:
    """An instant as an aware datetime; None for none, or for a slot that never comes."""
    if instant is None or not math.isfinite(instant):
        return None
    return datetime.fromtimestamp(instant, UTC)


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A `workflow_schedules` row. `task` is the template's JSON (None with a template task
    id); `project_id` and `user_id` are its metadata's, which scope the schedule as a task's
    scope its workflow."""

    schedule_id: str
    project_id: str
    user_id: str
    cron: str
    time_zone: str
    task: JsonObject | None
    template_task_id: str
    overlap: str
    catch_up: str
    paused: bool
    next_fire_time: datetime | None
    last_fire_time: datetime | None
    last_task_id: str
    created_by: str
    created_at: datetime
    updated_at: datetime
    #: The id its creator named, when another tenant's schedule held that id: the row's key
    #: (`schedule_id`) is then `own_key`'s. None for every other schedule.
    public_id: str | None = None

    @property
    def shown_id(self) -> str:
        """The id callers name the schedule by (and its slots' workflows show)."""
        return self.public_id or self.schedule_id
