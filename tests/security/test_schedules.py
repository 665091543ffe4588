"""Schedules as an attacker meets them: another tenant's schedule does not exist for it (get,
list, update, delete), it cannot create one for another project nor move its own into one,
its template is refused as StartWorkflow would refuse the task, and hostile calendars (huge,
zoneinfo path tricks, a zero interval) are INVALID_ARGUMENT naming the field, with nothing
stored."""

from __future__ import annotations

from typing import Any

import grpc
import psycopg
import pytest

from tests.conftest import RunningEngine
from tests.security.conftest import as_caller, tenant_task
from tests.support.helpers import step
from workflow_engine.v1 import workflow_engine_pb2 as pb


async def refusal(call: Any) -> tuple[grpc.StatusCode, str]:
    try:
        result = await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), (exc.details() or "")
    raise AssertionError(f"not refused: {result}")


async def count(db_url: str) -> int:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute("SELECT count(*) FROM workflow_schedules")
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


def hourly(project: str, **kw: Any) -> pb.Schedule:
    kw.setdefault("task", tenant_task(project, step("s", "echo", "hi")))
    kw.setdefault("cron", "@every 1h")
    return pb.Schedule(**kw)


async def test_another_tenants_schedule_does_not_exist_for_it(served: RunningEngine) -> None:
    stub = served.stub
    mine = await stub.CreateSchedule(
        pb.CreateScheduleRequest(schedule=hourly("project-a")), metadata=as_caller("a-orchestrator")
    )
    sid = mine.schedule_id
    b = as_caller("b-orchestrator")
    missing = "00000000-0000-4000-8000-000000000000"
    for call, absent in [
        (
            stub.GetSchedule(pb.GetScheduleRequest(schedule_id=sid), metadata=b),
            stub.GetSchedule(pb.GetScheduleRequest(schedule_id=missing), metadata=b),
        ),
        (
            stub.DeleteSchedule(pb.DeleteScheduleRequest(schedule_id=sid), metadata=b),
            stub.DeleteSchedule(pb.DeleteScheduleRequest(schedule_id=missing), metadata=b),
        ),
        (
            stub.UpdateSchedule(
                pb.UpdateScheduleRequest(
                    schedule=pb.Schedule(schedule_id=sid, paused=True), update_mask=["paused"]
                ),
                metadata=b,
            ),
            stub.UpdateSchedule(
                pb.UpdateScheduleRequest(
                    schedule=pb.Schedule(schedule_id=missing, paused=True),
                    update_mask=["paused"],
                ),
                metadata=b,
            ),
        ),
    ]:
        code, details = await refusal(call)
        other_code, other_details = await refusal(absent)
        assert code == other_code == grpc.StatusCode.NOT_FOUND
        assert details.replace(sid, "X") == other_details.replace(missing, "X")
    listed = await stub.ListSchedules(pb.ListSchedulesRequest(), metadata=b)
    assert list(listed.schedules) == []
    reader = await stub.ListSchedules(pb.ListSchedulesRequest(), metadata=as_caller("a-reader"))
    assert [s.schedule_id for s in reader.schedules] == [sid]
    still = await stub.GetSchedule(
        pb.GetScheduleRequest(schedule_id=sid), metadata=as_caller("a-orchestrator")
    )
    assert still == mine


async def test_no_schedule_for_another_project(served: RunningEngine, db_url: str) -> None:
    a = as_caller("a-orchestrator")
    code, _ = await refusal(
        served.stub.CreateSchedule(
            pb.CreateScheduleRequest(schedule=hourly("project-b")), metadata=a
        )
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED
    mine = await served.stub.CreateSchedule(
        pb.CreateScheduleRequest(schedule=hourly("project-a")), metadata=a
    )
    code, _ = await refusal(
        served.stub.UpdateSchedule(
            pb.UpdateScheduleRequest(
                schedule=hourly("project-b", schedule_id=mine.schedule_id), update_mask=["task"]
            ),
            metadata=a,
        )
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert await count(db_url) == 1


async def test_readers_and_operators_may_not_create_schedules(served: RunningEngine) -> None:
    for who in ("a-reader", "a-operator"):
        code, _ = await refusal(
            served.stub.CreateSchedule(
                pb.CreateScheduleRequest(schedule=hourly("project-a")), metadata=as_caller(who)
            )
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize(
    ("schedule", "field"),
    [
        (hourly("project-a", cron="* " * 5000), "schedule.cron"),
        (hourly("project-a", cron="@every 0s"), "schedule.cron"),
        (hourly("project-a", cron="@every 00000000000000000001s"), "schedule.cron"),
        (hourly("project-a", time_zone="E" * 10000), "schedule.time_zone"),
        (hourly("project-a", time_zone="../../etc/passwd"), "schedule.time_zone"),
        (hourly("project-a", time_zone="/etc/passwd"), "schedule.time_zone"),
        (hourly("project-a", time_zone="Europe/../../../../etc/shadow"), "schedule.time_zone"),
        (hourly("project-a", time_zone="Europe/Berlin\x00"), "schedule.time_zone"),
        (hourly("project-a", time_zone="__init__"), "schedule.time_zone"),
        (
            hourly(
                "project-a",
                task=tenant_task("project-a", step("s", "true", env={"LD_PRELOAD": "/tmp/x.so"})),
            ),
            "schedule.task.steps[0].env",
        ),
    ],
)
async def test_hostile_schedules_are_refused_and_nothing_stored(
    served: RunningEngine, db_url: str, schedule: pb.Schedule, field: str
) -> None:
    code, details = await refusal(
        served.stub.CreateSchedule(
            pb.CreateScheduleRequest(schedule=schedule), metadata=as_caller("a-orchestrator")
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT, details
    assert details.startswith(field), details
    assert await count(db_url) == 0
