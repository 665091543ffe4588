"""Schedules firing on real engines and a real PostgreSQL, in real time with short intervals:
downtime meets the catch-up policy, overlap SKIP starts nothing while the previous run is
unfinished, and a slot started before a crash is not started again. (Two replicas firing one
schedule: tests/e2e/test_schedule_replicas.py, with `serve` processes.)"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.clock import ManualClock
from tests.support.helpers import step, task
from workflow_engine.config import Settings
from workflow_engine.domain.schedules import slot_task, slot_task_id
from workflow_engine.domain.task import TaskSpec
from workflow_engine.runtime._schedules import Scheduler
from workflow_engine.v1 import workflow_engine_pb2 as pb


def quick(settings: Settings, **kw: Any) -> Settings:
    return replace(settings, timer_interval_seconds=0.2, **kw)


async def slots_started(db_url: str, schedule_id: str) -> list[tuple[datetime, str, str]]:
    """(slot, task id, status) of every workflow the schedule started, oldest slot first."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT schedule_slot, task_id::text, status FROM workflow_checkpoints"
            " WHERE schedule_id = %s ORDER BY schedule_slot",
            (schedule_id,),
        )
        return [(row[0], row[1], row[2]) for row in await cur.fetchall()]


async def all_finished(db_url: str, schedule_id: str, timeout: float = 30) -> list[Any]:
    deadline = time.monotonic() + timeout
    while True:
        rows = await slots_started(db_url, schedule_id)
        if all(status in ("SUCCEEDED", "FAILED", "CANCELLED") for _, _, status in rows):
            return rows
        assert time.monotonic() < deadline, rows
        await asyncio.sleep(0.2)


async def pause(stub: Any, schedule_id: str) -> None:
    await stub.UpdateSchedule(
        pb.UpdateScheduleRequest(
            schedule=pb.Schedule(schedule_id=schedule_id, paused=True), update_mask=["paused"]
        )
    )


@pytest.mark.parametrize("catch_up", [pb.SKIP_MISSED, pb.RUN_ONCE])
async def test_downtime_across_three_slots_meets_the_catch_up_policy(
    settings: Settings, db_url: str, catch_up: pb.CatchUpPolicy.ValueType
) -> None:
    every = 3
    config = quick(settings, schedule_missed_after_seconds=0.5)
    running: RunningEngine = await start_engine(config)
    created = await running.stub.CreateSchedule(
        pb.CreateScheduleRequest(
            schedule=pb.Schedule(
                cron=f"@every {every}s", catch_up=catch_up, task=task(step("hi", "echo", "hi"))
            )
        )
    )
    sid = created.schedule_id
    await stop_engine(running)
    stopped = time.time()
    before = {slot.timestamp() for slot, _, _ in await slots_started(db_url, sid)}
    first_missed = (math.floor(stopped) // every + 1) * every
    latest_missed = first_missed + 2 * every  # three slots pass while no engine runs
    await asyncio.sleep(latest_missed + 0.7 - time.time())  # L is older than 0.5 s now
    running = await start_engine(config)
    try:
        await asyncio.sleep(every - 1.0)  # the first pass has run; the next slot is not due
        after = await running.stub.GetSchedule(pb.GetScheduleRequest(schedule_id=sid))
        await pause(running.stub, sid)
        rows = await all_finished(db_url, sid)
    finally:
        await stop_engine(running)
    started = {slot.timestamp() for slot, _, _ in rows} - before
    if catch_up == pb.RUN_ONCE:
        assert started == {float(latest_missed)}
    else:
        assert started == set()
    assert after.last_fire_time.seconds == latest_missed
    assert after.next_fire_time.seconds == latest_missed + every


async def test_overlap_skip_starts_nothing_while_the_previous_run_is_unfinished(
    settings: Settings, db_url: str
) -> None:
    running = await start_engine(quick(settings))
    try:
        created = await running.stub.CreateSchedule(
            pb.CreateScheduleRequest(
                schedule=pb.Schedule(
                    cron="@every 1s", overlap=pb.SKIP, task=task(step("slow", "sleep", "4"))
                )
            )
        )
        sid = created.schedule_id
        rows: list[Any] = []
        for _ in range(50):
            rows = await slots_started(db_url, sid)
            if rows:
                break
            await asyncio.sleep(0.1)
        assert len(rows) == 1
        await asyncio.sleep(3)
        rows = await slots_started(db_url, sid)
        assert len(rows) == 1 and rows[0][2] == "RUNNING", rows  # slots passed: all skipped
        for _ in range(100):
            rows = await slots_started(db_url, sid)
            if len(rows) >= 2:
                break
            await asyncio.sleep(0.1)
        await pause(running.stub, sid)
        assert len(rows) == 2, rows
        stored = await running.stub.GetSchedule(pb.GetScheduleRequest(schedule_id=sid))
        assert stored.last_task_id == rows[1][1]
    finally:
        await stop_engine(running)
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT min(created_at) FILTER (WHERE task_id = %(second)s AND seq = 1),"
            " min(created_at) FILTER (WHERE task_id = %(first)s AND status = 'SUCCEEDED')"
            " FROM workflow_events WHERE task_id IN (%(first)s, %(second)s)",
            {"first": rows[0][1], "second": rows[1][1]},
        )
        span = await cur.fetchone()
    assert span is not None and span[1] is not None
    assert span[0] >= span[1]  # the second started after the first ended


class _NoSource:
    where = "nowhere"

    async def load(self, task_id: str) -> TaskSpec:
        raise AssertionError("the template is inline")


async def test_a_slot_started_before_a_crash_is_not_started_again(
    settings: Settings, db_url: str
) -> None:
    """A replica that started a slot's workflow and died before moving the schedule on
    leaves the slot due; the next pass (here on a clock set by hand) meets that workflow,
    starts nothing, and moves the schedule on."""
    running = await start_engine(replace(settings, schedules_enabled=False))
    try:
        engine = running.engine
        created = await running.stub.CreateSchedule(
            pb.CreateScheduleRequest(
                schedule=pb.Schedule(cron="@every 1h", task=task(step("hi", "echo", "hi")))
            )
        )
        sid = created.schedule_id
        slot = float(created.next_fire_time.seconds)
        record = await engine.schedules.get(sid, None)
        assert record.task is not None
        crashed = slot_task(TaskSpec.from_json(record.task), sid, slot)
        task_id = slot_task_id(sid, slot)
        slot_at = datetime.fromtimestamp(slot, UTC)

        async def start(tid: str, spec: TaskSpec, schedule: tuple[str, datetime]) -> Any:
            return await engine.service.start(
                task_id=tid, holder_id="", idempotency_key=tid, task=spec, schedule=schedule
            )

        await start(task_id, crashed, (sid, slot_at))  # ... and then it died
        clock = ManualClock(start=slot + 0.1)
        scheduler = Scheduler(
            pool=engine.pool,
            start=start,
            task_source=_NoSource(),
            clock=clock,
            interval_seconds=0.2,
            missed_after_seconds=60,
        )
        assert await scheduler.sweep() == 0  # taken: nothing new started
        after = await engine.schedules.get(sid, None)
        assert after.next_fire_time == datetime.fromtimestamp(slot + 3600, UTC)
        assert after.last_task_id == task_id
        assert await scheduler.sweep() == 0  # nothing due any more
        await all_finished(db_url, sid)  # overlap SKIP: the next slot waits for it
        clock.advance(3600)
        assert await scheduler.sweep() == 1  # the next slot, on the clock set by hand
        rows = await all_finished(db_url, sid)
    finally:
        await stop_engine(running)
    assert [row[1] for row in rows] == [task_id, slot_task_id(sid, slot + 3600)]
