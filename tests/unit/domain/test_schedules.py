"""Schedules' slot calculation and firing decision, with the instants given (no sleeping)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo

import pytest

from workflow_engine.domain.schedules import (
    Calendar,
    CatchUp,
    Overlap,
    decide,
    parse_calendar,
    slot_task_id,
    slot_text,
)
from workflow_engine.errors import InvalidArgument

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def at(year: int, month: int, day: int, hour: int, minute: int = 0, zone: tzinfo = UTC) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=zone).timestamp()


def slots(calendar: Calendar, after: float, count: int) -> list[datetime]:
    found: list[datetime] = []
    for _ in range(count):
        after = calendar.next_after(after)
        found.append(datetime.fromtimestamp(after, UTC))
    return found


def utc(year: int, month: int, day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def test_berlin_spring_forward_fires_the_missing_slot_right_after_the_change() -> None:
    # 2026-03-29 02:00 CET becomes 03:00 CEST: 02:30 does not exist that day.
    calendar = parse_calendar("30 2 * * *", "Europe/Berlin")
    found = slots(calendar, at(2026, 3, 28, 12), 3)
    assert found == [utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30), utc(2026, 3, 31, 0, 30)]


def test_berlin_fall_back_fires_the_repeated_slot_once() -> None:
    # 2026-10-25 03:00 CEST becomes 02:00 CET: 02:30 happens twice; it fires at the first.
    calendar = parse_calendar("30 2 * * *", "Europe/Berlin")
    found = slots(calendar, at(2026, 10, 24, 12), 3)
    assert found == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30), utc(2026, 10, 27, 1, 30)]


def test_new_york_daily_keeps_local_time_across_both_changes() -> None:
    calendar = parse_calendar("@daily", "America/New_York")
    spring = slots(calendar, at(2026, 3, 7, 12), 3)  # DST starts 2026-03-08
    assert [d.astimezone(NEW_YORK).hour for d in spring] == [0, 0, 0]
    assert [(b - a).total_seconds() / 3600 for a, b in itertools.pairwise(spring)] == [
        23,
        24,
    ]
    autumn = slots(calendar, at(2026, 10, 31, 12), 3)  # DST ends 2026-11-01
    assert [d.astimezone(NEW_YORK).hour for d in autumn] == [0, 0, 0]
    assert (autumn[1] - autumn[0]).total_seconds() == 25 * 3600


def test_new_york_hourly_through_the_repeated_hour_counts_real_hours() -> None:
    calendar = parse_calendar("0 * * * *", "America/New_York")
    found = slots(calendar, at(2026, 11, 1, 4, 30), 4)  # 00:30 EDT
    # 01:00 EDT, 01:00 EST (the hour again), 02:00 EST, 03:00 EST: one slot each real hour.
    assert found == [
        utc(2026, 11, 1, 5),
        utc(2026, 11, 1, 6),
        utc(2026, 11, 1, 7),
        utc(2026, 11, 1, 8),
    ]


def test_new_york_fall_back_fires_a_fixed_time_in_the_repeated_hour_once() -> None:
    calendar = parse_calendar("30 1 * * *", "America/New_York")
    found = slots(calendar, at(2026, 10, 31, 12), 3)
    assert found == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30), utc(2026, 11, 3, 6, 30)]


def test_slots_are_strictly_after_the_instant() -> None:
    calendar = parse_calendar("@hourly", "")
    assert calendar.next_after(at(2026, 1, 1, 10)) == at(2026, 1, 1, 11)
    assert calendar.next_after(at(2026, 1, 1, 10) - 1) == at(2026, 1, 1, 10)


@pytest.mark.parametrize(
    ("macro", "after", "expected"),
    [
        ("@hourly", utc(2026, 5, 5, 10, 1), utc(2026, 5, 5, 11)),
        ("@daily", utc(2026, 5, 5, 10), utc(2026, 5, 6, 0)),
        ("@weekly", utc(2026, 5, 5, 10), utc(2026, 5, 10, 0)),  # a Sunday
        ("@monthly", utc(2026, 5, 5, 10), utc(2026, 6, 1, 0)),
        ("@yearly", utc(2026, 5, 5, 10), utc(2027, 1, 1, 0)),
    ],
)
def test_macros(macro: str, after: datetime, expected: datetime) -> None:
    assert parse_calendar(macro, "").next_after(after.timestamp()) == expected.timestamp()


def test_intervals_are_multiples_of_the_interval_since_the_epoch() -> None:
    calendar = parse_calendar("@every 30s", "Europe/Berlin")  # the zone does not matter
    assert calendar.next_after(1_000_000_000.0) == 1_000_000_020.0
    assert calendar.next_after(1_000_000_020.0) == 1_000_000_050.0
    assert calendar.next_after(1_000_000_020.5) == 1_000_000_050.0
    assert parse_calendar("@every 2m", "").next_after(0.0) == 120.0
    assert parse_calendar("@every 1h", "").next_after(3599.0) == 3600.0


@pytest.mark.parametrize(
    "cron",
    [
        "",
        "   ",
        "* * * *",
        "* * * * * *",
        "61 * * * *",
        "* 24 * * *",
        "0 0 30 2 *",
        "0 0 */8 * 5#5",  # parses, but no fifth Friday is the 1st, 9th, 17th or 25th
        "@reboot",
        "@every",
        "@every 0s",
        "@every -5s",
        "@every 5d",
        "@every 5",
        "@every 9999999h",
        "x" * 300,
        "0 0 * * \x00",
    ],
)
def test_bad_cron_names_the_field(cron: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_calendar(cron, "")
    assert refused.value.field == "schedule.cron"


@pytest.mark.parametrize(
    "zone",
    [
        "Mars/Olympus",
        "../../etc/passwd",
        "/etc/localtime",
        "Europe/../../../etc/passwd",
        "Europe/Berlin\x00",
        "Europe/",
        "a" * 100,
        ".",
        "zoneinfo",
    ],
)
def test_bad_time_zone_names_the_field(zone: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_calendar("@daily", zone)
    assert refused.value.field == "schedule.time_zone"


def test_good_zones() -> None:
    assert parse_calendar("@daily", "").zone is UTC
    assert parse_calendar("@daily", "UTC").zone == ZoneInfo("UTC")
    assert parse_calendar("@daily", "America/Argentina/Buenos_Aires").zone is not None


CAL = Calendar("", UTC, 10)  # a slot every 10 s


def test_nothing_due_before_the_next_fire_time() -> None:
    assert (
        decide(
            CAL,
            100.0,
            now=99.9,
            missed_after=60,
            catch_up="SKIP_MISSED",
            overlap="SKIP",
            previous_unfinished=False,
        )
        is None
    )


def test_an_on_time_slot_fires_and_time_moves_to_the_next() -> None:
    firing = decide(
        CAL,
        100.0,
        now=100.2,
        missed_after=60,
        catch_up="SKIP_MISSED",
        overlap="SKIP",
        previous_unfinished=False,
    )
    assert firing is not None
    assert (firing.slot, firing.handled, firing.next_fire_time) == (100.0, 100.0, 110.0)
    assert firing.outcome == "started"


def test_only_the_latest_of_several_due_slots_counts() -> None:
    firing = decide(
        CAL,
        100.0,
        now=135.0,
        missed_after=60,
        catch_up="SKIP_MISSED",
        overlap="ALLOW",
        previous_unfinished=True,
    )
    assert firing is not None
    assert (firing.slot, firing.next_fire_time, firing.outcome) == (130.0, 140.0, "started")


@pytest.mark.parametrize(("catch_up", "fired"), [("SKIP_MISSED", None), ("RUN_ONCE", 1000.0)])
def test_missed_slots_follow_the_catch_up_policy(catch_up: CatchUp, fired: float | None) -> None:
    firing = decide(
        CAL,
        100.0,
        now=1005.0,
        missed_after=2,
        catch_up=catch_up,
        overlap="SKIP",
        previous_unfinished=False,
    )
    assert firing is not None
    assert (firing.slot, firing.handled, firing.next_fire_time) == (fired, 1000.0, 1010.0)
    assert firing.outcome == ("missed" if fired is None else "started")


def test_missed_is_measured_from_the_latest_slot() -> None:
    firing = decide(
        CAL,
        100.0,
        now=1002.0,
        missed_after=2,
        catch_up="SKIP_MISSED",
        overlap="SKIP",
        previous_unfinished=False,
    )
    assert firing is not None and firing.slot == 1000.0  # 1000 is on time; 100..990 missed


@pytest.mark.parametrize(("overlap", "fired"), [("SKIP", None), ("ALLOW", 100.0)])
def test_overlap_policy_while_the_previous_run_is_unfinished(
    overlap: Overlap, fired: float | None
) -> None:
    firing = decide(
        CAL,
        100.0,
        now=100.0,
        missed_after=60,
        catch_up="SKIP_MISSED",
        overlap=overlap,
        previous_unfinished=True,
    )
    assert firing is not None
    assert (firing.slot, firing.next_fire_time) == (fired, 110.0)
    assert firing.outcome == ("skipped" if fired is None else "started")


def test_a_long_downtime_of_a_cron_schedule_finds_the_latest_slot() -> None:
    calendar = parse_calendar("*/5 * * * *", "Europe/Berlin")
    first = at(2026, 1, 1, 0)
    firing = decide(
        calendar,
        first,
        now=at(2026, 3, 1, 12, 7),
        missed_after=60,
        catch_up="RUN_ONCE",
        overlap="SKIP",
        previous_unfinished=False,
    )
    assert firing is not None
    assert firing.slot == at(2026, 3, 1, 12, 5)
    assert firing.next_fire_time == at(2026, 3, 1, 12, 10)


def test_slot_task_ids_are_stable_and_distinct() -> None:
    assert slot_text(at(2026, 11, 27, 21)) == "2026-11-27T21:00:00Z"
    a = slot_task_id("s1", 100.0)
    assert a == slot_task_id("s1", 100.0)
    assert a != slot_task_id("s1", 110.0)
    assert a != slot_task_id("s2", 100.0)
