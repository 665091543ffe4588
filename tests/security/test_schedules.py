"""Schedules as an attacker meets them: another tenant's schedule does not exist for it (get,
list, update, delete), it cannot create one for another project nor move its own into one,
its template is refused as StartWorkflow would refuse the task, and hostile calendars (huge,
zoneinfo path tricks, a zero interval) are INVALID_ARGUMENT naming the field, with nothing
stored."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf.json_format import MessageToDict
from psycopg.types.json import Jsonb

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.security.conftest import as_caller, tenant_task
from tests.support.clock import ManualClock
from tests.support.helpers import refusal, step, stored_schedules
from workflow_engine.config import Settings
from workflow_engine.domain.schedules import slot_task_id
from workflow_engine.domain.task import TaskSpec
from workflow_engine.errors import ResourceExhausted
from workflow_engine.runtime._schedules import Scheduler
from workflow_engine.v1 import workflow_engine_pb2 as pb


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
    assert await stored_schedules(db_url) == 1


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
    assert await stored_schedules(db_url) == 0


class _TaskTable:
    """A task source whose tasks an orchestrator may change between slots (as its table's
    rows can be): `tasks` is read at every load."""

    where = "the test's tasks"

    def __init__(self, tasks: dict[str, TaskSpec]) -> None:
        self.tasks = tasks

    async def load(self, task_id: str) -> TaskSpec:
        return self.tasks[task_id]


async def test_a_template_task_moved_to_another_tenant_starts_nothing_there(
    settings: Settings, db_url: str
) -> None:
    """A schedule loads its `template_task_id` at every slot; a task that now belongs to
    another project (or user) than the schedule was made for would start a workflow in that
    tenant's name. The slot starts nothing; the control (same owner) starts one."""
    running = await start_engine(replace(settings, schedules_enabled=False))
    try:
        engine = running.engine
        mine = TaskSpec.from_json(
            MessageToDict(
                tenant_task("project-a", step("s", "echo", "hi")),
                preserving_proto_field_name=True,
            )
            | {"prompt": "nightly"}
        )
        source = _TaskTable({"template-1": mine})
        slot = (int(time.time()) // 3600) * 3600.0
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            for sid in ("sched-moved", "sched-kept"):
                await conn.execute(
                    "INSERT INTO workflow_schedules (schedule_id, project_id, user_id, cron,"
                    " template_task_id, overlap, catch_up, next_fire_time)"
                    " VALUES (%s, %s, %s, '@every 1h', 'template-1', 'ALLOW', 'RUN_ONCE',"
                    " to_timestamp(%s))",
                    (sid, "project-a", mine.metadata.user_id, slot),
                )
            await conn.execute(
                "UPDATE workflow_schedules SET project_id = 'project-b', user_id = %s"
                " WHERE schedule_id = 'sched-moved'",
                (mine.metadata.user_id,),
            )

        async def start(tid: str, spec: TaskSpec, schedule: tuple[str, datetime]) -> Any:
            return await engine.service.start(
                task_id=tid, holder_id="", idempotency_key=tid, task=spec, schedule=schedule
            )

        scheduler = Scheduler(
            pool=engine.pool,
            start=start,
            task_source=source,
            clock=ManualClock(start=slot + 1),
            interval_seconds=1,
            missed_after_seconds=60,
        )
        assert await scheduler.sweep() == 1  # the control only
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            cur = await conn.execute(
                "SELECT schedule_id FROM workflow_checkpoints WHERE schedule_id IS NOT NULL"
            )
            started = [row[0] for row in await cur.fetchall()]
            cur = await conn.execute(
                "SELECT last_task_id, next_fire_time > to_timestamp(%s)"
                " FROM workflow_schedules WHERE schedule_id = 'sched-moved'",
                (slot,),
            )
            moved = await cur.fetchone()
    finally:
        await stop_engine(running)
    assert started == ["sched-kept"]
    assert moved == ("", True)  # the slot was handled: it started nothing, and time moved on


async def test_a_templates_secrets_are_shown_to_nobody(served: RunningEngine) -> None:
    """A template's secret env values (and the engine's credentials) are masked in every
    schedule answer, as GetWorkflow masks a workflow's: the reader of the tenant, and the
    orchestrator that wrote them, see `[secret]`."""
    secret = "hunter2-very-secret-token"
    secret_step = step("s", "env")
    secret_step.env["API_TOKEN"] = secret
    secret_step.secret_env.append("API_TOKEN")
    created = await served.stub.CreateSchedule(
        pb.CreateScheduleRequest(
            schedule=hourly("project-a", task=tenant_task("project-a", secret_step))
        ),
        metadata=as_caller("a-orchestrator"),
    )
    sid = created.schedule_id
    answers: list[Any] = [created]
    for who in ("a-orchestrator", "a-reader"):
        meta = as_caller(who)
        answers.append(
            await served.stub.GetSchedule(pb.GetScheduleRequest(schedule_id=sid), metadata=meta)
        )
        answers.append(await served.stub.ListSchedules(pb.ListSchedulesRequest(), metadata=meta))
    answers.append(
        await served.stub.UpdateSchedule(
            pb.UpdateScheduleRequest(
                schedule=pb.Schedule(schedule_id=sid, paused=True), update_mask=["paused"]
            ),
            metadata=as_caller("a-orchestrator"),
        )
    )
    for answer in answers:
        assert secret.encode() not in answer.SerializeToString()
    assert created.task.steps[0].env["API_TOKEN"] == "[secret]"
    # Sent back as read, the template is refused rather than stored with the mask.
    code, message = await refusal(
        served.stub.UpdateSchedule(
            pb.UpdateScheduleRequest(
                schedule=pb.Schedule(schedule_id=sid, task=created.task), update_mask=["task"]
            ),
            metadata=as_caller("a-orchestrator"),
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "schedule.task.steps[0].env" in message


async def _insert_schedules(db_url: str, rows: list[tuple[str, str, float]]) -> None:
    """(schedule_id, project_id, next slot) rows of `@every 1h` schedules with an inline
    template, written as the engine writes them."""
    template = Jsonb(
        TaskSpec.from_json(
            MessageToDict(
                tenant_task("project-a", step("s", "echo", "hi")), preserving_proto_field_name=True
            )
        ).to_json()
    )
    async with (
        await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn,
        conn.cursor() as cur,
    ):
        await cur.executemany(
            "INSERT INTO workflow_schedules (schedule_id, project_id, cron, task, overlap,"
            " catch_up, next_fire_time) VALUES (%s, %s, '@every 1h', %s, 'SKIP',"
            " 'RUN_ONCE', to_timestamp(%s))",
            [(sid, project, template, slot) for sid, project, slot in rows],
        )


async def test_a_tenant_whose_slots_are_stuck_does_not_hold_off_another(
    settings: Settings, db_url: str
) -> None:
    """Tenant A has 150 schedules due whose starts are all deferred (A is at its cap of
    running workflows): tenant B's slot, due a second later than all of them, starts in the
    very first pass, and A's stuck schedules are left out of the next passes for a while."""
    running = await start_engine(replace(settings, schedules_enabled=False))
    try:
        slot = (int(time.time()) // 3600) * 3600.0
        await _insert_schedules(
            db_url,
            [(f"a-{i:03}", "project-a", slot - 3600) for i in range(150)]
            + [("b-000", "project-b", slot)],
        )
        started: list[str] = []
        attempts: list[str] = []

        async def start(tid: str, spec: TaskSpec, schedule: tuple[str, datetime]) -> Any:
            attempts.append(schedule[0])
            if schedule[0].startswith("a-"):
                raise ResourceExhausted("project-a is running as many workflows as it may")
            started.append(schedule[0])
            return await running.engine.service.start(
                task_id=tid, holder_id="", idempotency_key=tid, task=spec, schedule=schedule
            )

        clock = ManualClock(start=slot + 1)
        scheduler = Scheduler(
            pool=running.engine.pool,
            start=start,
            task_source=_TaskTable({}),
            clock=clock,
            interval_seconds=1,
            missed_after_seconds=7200,
        )
        assert await scheduler.sweep() == 1
        assert started == ["b-000"]
        first = set(attempts)
        clock.advance(1)
        await scheduler.sweep()  # A's deferred schedules are backed off from, not retried
        second = set(attempts) - first
    finally:
        await stop_engine(running)
    assert len(first) == 21  # at most 20 of A's in one pass, and B's
    assert len(second) == 20  # 20 others of A's; the first 20 wait out their back-off


async def test_a_workflow_started_under_a_slots_task_id_is_not_the_schedules(
    settings: Settings, db_url: str
) -> None:
    """Slot task ids are computable by anyone who knows the schedule's id. A workflow another
    caller started first under one (here: one that waits for approval forever) is not
    adopted as the schedule's last run: the slot is lost, but the overlap SKIP schedule is
    not held off by it, and the next slot starts."""
    running = await start_engine(replace(settings, schedules_enabled=False))
    try:
        engine = running.engine
        slot = (int(time.time()) // 3600) * 3600.0
        await _insert_schedules(db_url, [("sched-victim", "project-a", slot)])
        squatter = step("wait", "echo", "hi")
        squatter.requires_approval = True
        await running.stub.StartWorkflow(
            pb.StartWorkflowRequest(
                task_id=slot_task_id("sched-victim", slot),
                task=tenant_task("project-b", squatter),
            )
        )

        async def start(tid: str, spec: TaskSpec, schedule: tuple[str, datetime]) -> Any:
            return await engine.service.start(
                task_id=tid, holder_id="", idempotency_key=tid, task=spec, schedule=schedule
            )

        clock = ManualClock(start=slot + 1)
        scheduler = Scheduler(
            pool=engine.pool,
            start=start,
            task_source=_TaskTable({}),
            clock=clock,
            interval_seconds=1,
            missed_after_seconds=60,
        )
        assert await scheduler.sweep() == 0
        victim = await engine.schedules.get("sched-victim", None)
        clock.advance(3600)
        assert await scheduler.sweep() == 1  # not held off by the squatter's waiting workflow
        after = await engine.schedules.get("sched-victim", None)
    finally:
        await stop_engine(running)
    assert victim.last_task_id == ""
    assert after.last_task_id == slot_task_id("sched-victim", slot + 3600)
