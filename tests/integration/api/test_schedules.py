"""Schedules over gRPC on a real engine and PostgreSQL: create, get, list, update, delete, the
refusals (each INVALID_ARGUMENT naming its field, nothing stored), and the workflows a
schedule starts (named by ListWorkflows' schedule filter)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.helpers import new_task_id, refusal, step, stored_schedules, task
from workflow_engine.config import Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb


@pytest.fixture
async def quick(settings: Settings) -> AsyncIterator[RunningEngine]:
    """An engine that looks for due slots every 0.2 s."""
    running = await start_engine(replace(settings, timer_interval_seconds=0.2))
    try:
        yield running
    finally:
        await stop_engine(running)


def schedule(cron: str = "@every 1h", **kw: Any) -> pb.Schedule:
    kw.setdefault("task", task(step("hi", "echo", "hi")))
    return pb.Schedule(cron=cron, **kw)


async def test_crud(running: RunningEngine) -> None:
    stub = running.stub
    before = time.time()
    created = await stub.CreateSchedule(
        pb.CreateScheduleRequest(schedule=schedule("30 2 * * *", time_zone="Europe/Berlin"))
    )
    assert created.schedule_id and created.cron == "30 2 * * *"
    assert created.overlap == pb.SKIP and created.catch_up == pb.SKIP_MISSED
    assert created.next_fire_time.seconds > before
    assert created.task.steps[0].command == ["echo", "hi"]
    assert not created.HasField("last_fire_time")

    got = await stub.GetSchedule(pb.GetScheduleRequest(schedule_id=created.schedule_id))
    assert got == created

    paused = await stub.UpdateSchedule(
        pb.UpdateScheduleRequest(
            schedule=pb.Schedule(schedule_id=created.schedule_id, paused=True),
            update_mask=["paused"],
        )
    )
    assert paused.paused and not paused.HasField("next_fire_time")
    assert paused.cron == created.cron and paused.task == created.task
    resumed = await stub.UpdateSchedule(
        pb.UpdateScheduleRequest(
            schedule=pb.Schedule(
                schedule_id=created.schedule_id, paused=False, cron="@hourly", overlap=pb.ALLOW
            ),
            update_mask=["paused", "cron", "overlap"],
        )
    )
    assert not resumed.paused and resumed.cron == "@hourly"
    assert resumed.overlap == pb.ALLOW
    assert 0 < resumed.next_fire_time.seconds - time.time() <= 3600

    second = await stub.CreateSchedule(pb.CreateScheduleRequest(schedule=schedule()))
    listed = await stub.ListSchedules(pb.ListSchedulesRequest(page_size=1))
    assert [s.schedule_id for s in listed.schedules] == [second.schedule_id]
    rest = await stub.ListSchedules(
        pb.ListSchedulesRequest(page_size=1, page_token=listed.next_page_token)
    )
    assert [s.schedule_id for s in rest.schedules] == [created.schedule_id]
    assert not rest.next_page_token

    await stub.DeleteSchedule(pb.DeleteScheduleRequest(schedule_id=created.schedule_id))
    code, _ = await refusal(
        stub.GetSchedule(pb.GetScheduleRequest(schedule_id=created.schedule_id))
    )
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await refusal(
        stub.DeleteSchedule(pb.DeleteScheduleRequest(schedule_id=created.schedule_id))
    )
    assert code == grpc.StatusCode.NOT_FOUND


async def test_a_given_id_is_kept_and_a_taken_one_refused(running: RunningEngine) -> None:
    schedule_id = new_task_id()
    created = await running.stub.CreateSchedule(
        pb.CreateScheduleRequest(schedule=schedule(schedule_id=schedule_id))
    )
    assert created.schedule_id == schedule_id
    code, _ = await refusal(
        running.stub.CreateSchedule(
            pb.CreateScheduleRequest(schedule=schedule(schedule_id=schedule_id))
        )
    )
    assert code == grpc.StatusCode.ALREADY_EXISTS


@pytest.mark.parametrize(
    ("sched", "field"),
    [
        (schedule("61 * * * *"), "schedule.cron"),
        (schedule("* * *"), "schedule.cron"),
        (schedule(""), "schedule.cron"),
        (schedule("@every 0s"), "schedule.cron"),
        (schedule("@daily", time_zone="Mars/Olympus"), "schedule.time_zone"),
        (schedule("@daily", time_zone="../../etc/passwd"), "schedule.time_zone"),
        (schedule("@daily", schedule_id="not-a-uuid"), "schedule.schedule_id"),
        (pb.Schedule(cron="@daily"), "schedule.task"),
        (schedule("@daily", template_task_id="nope"), "schedule.template_task_id"),
        (schedule("@daily", overlap=7), "schedule.overlap"),
        (
            schedule("@daily", task=task(step("x", "echo", env={"LD_PRELOAD": "/x"}))),
            "schedule.task",
        ),
    ],
)
async def test_bad_schedules_are_invalid_argument_naming_the_field(
    running: RunningEngine, db_url: str, sched: pb.Schedule, field: str
) -> None:
    code, details = await refusal(
        running.stub.CreateSchedule(pb.CreateScheduleRequest(schedule=sched))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert details.startswith(field), details
    assert await stored_schedules(db_url) == 0


async def test_update_refusals(running: RunningEngine) -> None:
    created = await running.stub.CreateSchedule(pb.CreateScheduleRequest(schedule=schedule()))
    sid = created.schedule_id
    for mask, sched, field in [
        ([], pb.Schedule(schedule_id=sid), "update_mask"),
        (["created_by"], pb.Schedule(schedule_id=sid), "update_mask"),
        (["cron"], pb.Schedule(schedule_id=sid, cron="nope"), "schedule.cron"),
        (["time_zone"], pb.Schedule(schedule_id=sid, time_zone="Nowhere/X"), "schedule.time_zone"),
        (["task"], pb.Schedule(schedule_id=sid), "schedule.task"),
    ]:
        code, details = await refusal(
            running.stub.UpdateSchedule(pb.UpdateScheduleRequest(schedule=sched, update_mask=mask))
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (mask, details)
        assert details.startswith(field), details
    got = await running.stub.GetSchedule(pb.GetScheduleRequest(schedule_id=sid))
    assert got == created


async def workflows_of(stub: Any, schedule_id: str) -> list[pb.Workflow]:
    listed = await stub.ListWorkflows(
        pb.ListWorkflowsRequest(schedule_id=schedule_id, page_size=500)
    )
    return list(listed.workflows)


async def test_a_schedule_fires_and_lists_its_workflows(quick: RunningEngine) -> None:
    stub = quick.stub
    created = await stub.CreateSchedule(pb.CreateScheduleRequest(schedule=schedule("@every 1s")))
    other = await stub.CreateSchedule(pb.CreateScheduleRequest(schedule=schedule("@every 1h")))
    for _ in range(100):
        mine = await workflows_of(stub, created.schedule_id)
        if len(mine) >= 2:
            break
        await asyncio.sleep(0.1)
    assert len(mine) >= 2
    assert {w.schedule_id for w in mine} == {created.schedule_id}
    assert all(w.schedule_slot.nanos == 0 for w in mine)
    assert await workflows_of(stub, other.schedule_id) == []
    workflow = await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=mine[0].task_id))
    assert workflow.schedule_id == created.schedule_id
    stored = await stub.GetSchedule(pb.GetScheduleRequest(schedule_id=created.schedule_id))
    assert stored.last_task_id and stored.HasField("last_fire_time")
    code, details = await refusal(stub.ListWorkflows(pb.ListWorkflowsRequest(schedule_id="bad")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("schedule_id")


async def test_a_paused_schedule_fires_nothing_until_resumed(quick: RunningEngine) -> None:
    stub = quick.stub
    created = await stub.CreateSchedule(
        pb.CreateScheduleRequest(schedule=schedule("@every 1s", paused=True))
    )
    await asyncio.sleep(2.5)
    assert await workflows_of(stub, created.schedule_id) == []
    await stub.UpdateSchedule(
        pb.UpdateScheduleRequest(
            schedule=pb.Schedule(schedule_id=created.schedule_id, paused=False),
            update_mask=["paused"],
        )
    )
    for _ in range(50):
        if await workflows_of(stub, created.schedule_id):
            break
        await asyncio.sleep(0.1)
    assert await workflows_of(stub, created.schedule_id)


async def test_list_refusals(running: RunningEngine) -> None:
    for request, field in [
        (pb.ListSchedulesRequest(page_size=501), "page_size"),
        (pb.ListSchedulesRequest(page_token="not a token"), "page_token"),
        (pb.ListSchedulesRequest(page_token="e30"), "page_token"),  # {}
    ]:
        code, details = await refusal(running.stub.ListSchedules(request))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(field), details


async def test_a_new_template_replaces_the_old(running: RunningEngine) -> None:
    created = await running.stub.CreateSchedule(pb.CreateScheduleRequest(schedule=schedule()))
    new = task(step("bye", "echo", "bye"))
    updated = await running.stub.UpdateSchedule(
        pb.UpdateScheduleRequest(
            schedule=pb.Schedule(schedule_id=created.schedule_id, task=new, time_zone="Asia/Tokyo"),
            update_mask=["task", "time_zone"],
        )
    )
    assert updated.task.steps[0].id == "bye" and updated.time_zone == "Asia/Tokyo"
    assert updated.cron == created.cron and updated.next_fire_time.seconds > 0
