"""`Calendar.latest_at_or_before` against the slot-by-slot walk it replaced.

The firing loop asks it for every due schedule on the event loop, so it must be cheap however
long a schedule was due, and it must name the slot forward iteration (Debian cron's rules
across daylight-saving changes) names, which reverse iteration alone does not promise.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from cronsim import CronSim

from workflow_engine.domain import schedules
from workflow_engine.domain.schedules import Calendar, parse_calendar

# 60 minutes, and some twice, in 180 characters: a slot every minute, read wall-clock-wise.
LONG_MINUTES = ",".join(str(m) for m in range(60)) + "," + ",".join(["0"] * 4)
CRONS = [
    "* * * * *",
    "*/7 * * * *",
    "0 * * * *",
    "0,30 * * * *",
    "* 2 * * *",
    "30 2 * * *",
    "30 1 * * *",
    "59 1 * * *",
    "0 2 * * *",
    "0 3 * * *",
    "15,45 1-3 * * *",
    "*/20 0-4 * * *",
    "0 0 * * *",
    "0 3 * * 0",
    f"{LONG_MINUTES} 0-23 * * *",
]
ZONES = ["Europe/Berlin", "America/New_York", ""]
# The 2026 changes of time, as UTC: Berlin's, then New York's.
CHANGES = [
    datetime(2026, 3, 29, 1, tzinfo=UTC),
    datetime(2026, 10, 25, 1, tzinfo=UTC),
    datetime(2026, 3, 8, 7, tzinfo=UTC),
    datetime(2026, 11, 1, 6, tzinfo=UTC),
]


def reference(calendar: Calendar, instant: float, first: float) -> float:
    """The latest slot <= instant, walking slot by slot from `first` (the old algorithm)."""
    last = first
    while (following := calendar.next_after(last)) <= instant:
        last = following
    return last


def cases(count: int, seed: int) -> Iterator[tuple[Calendar, float, float]]:
    """Random calendars, instants within hours of a change of time (or anywhere in 2026), and
    a first due slot up to three hours earlier."""
    rng = random.Random(seed)
    calendars = [parse_calendar(cron, zone) for cron in CRONS for zone in ZONES]
    produced = 0
    while produced < count:
        calendar = rng.choice(calendars)
        if rng.random() < 0.8:
            instant = rng.choice(CHANGES).timestamp() + rng.uniform(-6, 6) * 3600
        else:
            instant = datetime(2026, 1, 1, tzinfo=UTC).timestamp() + rng.uniform(0, 365) * 86400
        if rng.random() < 0.3:
            instant = float(int(instant) // 60 * 60)  # exactly on a minute: maybe a slot
        first = calendar.next_after(instant - rng.uniform(1, 3) * 3600)
        if first > instant:
            continue
        produced += 1
        yield calendar, instant, first


def describe(calendar: Calendar, instant: float) -> str:
    return f"{calendar.cron!r} in {calendar.zone} at {datetime.fromtimestamp(instant, UTC)}"


def test_matches_the_slot_by_slot_walk_around_changes_of_time() -> None:
    for calendar, instant, first in cases(400, seed=52):
        expected = reference(calendar, instant, first)
        assert calendar.latest_at_or_before(instant, first) == expected, describe(calendar, instant)


def test_the_fallback_walk_matches_it_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schedules, "_CANDIDATES", 0)  # no reverse candidate: walk from first
    for calendar, instant, first in cases(150, seed=53):
        expected = reference(calendar, instant, first)
        assert calendar.latest_at_or_before(instant, first) == expected, describe(calendar, instant)


def test_a_slot_at_the_instant_itself_counts() -> None:
    calendar = parse_calendar("0 * * * *", "Europe/Berlin")
    instant = datetime(2026, 3, 29, 1, tzinfo=UTC).timestamp()  # 03:00 CEST, just changed
    assert calendar.latest_at_or_before(instant, instant - 3600) == instant
    assert calendar.latest_at_or_before(instant + 0.5, instant - 3600) == instant
    assert calendar.latest_at_or_before(instant - 1, instant - 3600) == instant - 3600


class CountingCronSim(CronSim):
    """cronsim's iterator, counting the iterators made and the steps taken."""

    made = 0
    steps = 0

    def __init__(self, expr: str, dt: datetime, reverse: bool = False) -> None:
        type(self).made += 1
        super().__init__(expr, dt, reverse)

    def __next__(self) -> datetime:
        type(self).steps += 1
        return super().__next__()


NOW = datetime(2026, 11, 27, 21, 7, 13, tzinfo=UTC)
BERLIN_REPEATED = datetime(2026, 10, 25, 1, 56, 15, tzinfo=UTC)  # 02:56 CET, the second time
NEW_YORK_REPEATED = datetime(2026, 11, 1, 6, 23, tzinfo=UTC)  # 01:23 EST, the second time


@pytest.mark.parametrize(
    ("cron", "zone", "now", "due_seconds", "latest"),
    [  # the attacker review's cases, a long downtime, and instants in a repeated hour
        ("* * * * *", "", NOW, 48 * 3600, datetime(2026, 11, 27, 21, 7, tzinfo=UTC)),
        (
            f"{LONG_MINUTES} 0-23 * * *",
            "Europe/Berlin",
            NOW,
            48 * 3600,
            datetime(2026, 11, 27, 21, 7, tzinfo=UTC),
        ),
        ("* * 1 * *", "", NOW, 365 * 86400, datetime(2026, 11, 1, 23, 59, tzinfo=UTC)),
        (
            "*/5 * * * *",
            "America/New_York",
            NOW,
            400 * 86400,
            datetime(2026, 11, 27, 21, 5, tzinfo=UTC),
        ),
        (  # a fixed wall-clock minute fires once, the first time: 02:59 CEST
            f"{LONG_MINUTES} 0-23 * * *",
            "Europe/Berlin",
            BERLIN_REPEATED,
            48 * 3600,
            datetime(2026, 10, 25, 0, 59, tzinfo=UTC),
        ),
        (  # reverse proposes the day before's 01:30; forward's is 01:30 EDT today
            "30 1 * * *",
            "America/New_York",
            NEW_YORK_REPEATED,
            48 * 3600,
            datetime(2026, 11, 1, 5, 30, tzinfo=UTC),
        ),
    ],
)
def test_work_is_bounded_however_long_the_schedule_was_due(
    monkeypatch: pytest.MonkeyPatch,
    cron: str,
    zone: str,
    now: datetime,
    due_seconds: int,
    latest: datetime,
) -> None:
    calendar = parse_calendar(cron, zone)
    first = calendar.next_after(now.timestamp() - due_seconds)
    monkeypatch.setattr(CountingCronSim, "made", 0)
    monkeypatch.setattr(CountingCronSim, "steps", 0)
    monkeypatch.setattr(schedules, "CronSim", CountingCronSim)
    assert calendar.latest_at_or_before(now.timestamp(), first) == latest.timestamp()
    assert CountingCronSim.made <= 3
    assert CountingCronSim.steps <= 8
