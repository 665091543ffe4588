"""Schedule ids are a space per tenant: a tenant that names the id of another tenant's schedule
in `CreateSchedule` is answered as for an id nobody holds (it gets a schedule of its own under
that id), so it cannot learn that the id is taken; and the two schedules never meet: each
tenant reads, changes and deletes its own, and their slots start workflows under different
task ids, each listed under the id to its own tenant only."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

import grpc

from tests.conftest import start_engine, stop_engine
from tests.security.conftest import as_caller, tenant_task
from tests.support.clock import ManualClock
from tests.support.helpers import refusal, step
from workflow_engine.config import Settings
from workflow_engine.domain.task import TaskSpec
from workflow_engine.runtime._schedules import Scheduler
from workflow_engine.v1 import workflow_engine_pb2 as pb

UNKNOWN = "00000000-0000-4000-8000-00000000b0b0"


def hourly(project: str, schedule_id: str = "") -> pb.CreateScheduleRequest:
    task = tenant_task(project, step("s", "echo", project))
    return pb.CreateScheduleRequest(
        schedule=pb.Schedule(schedule_id=schedule_id, cron="@every 1h", task=task)
    )


class _NoTasks:
    where = "no task source"

    async def load(self, task_id: str) -> TaskSpec:
        raise AssertionError(f"the templates are inline; nothing loads {task_id}")


async def test_a_schedule_id_another_tenant_holds_is_answered_as_an_unknown_one(
    secured: Settings,
) -> None:
    running = await start_engine(replace(secured, schedules_enabled=False))
    try:
        stub, engine = running.stub, running.engine
        a, b = as_caller("a-orchestrator"), as_caller("b-orchestrator")
        theirs = await stub.CreateSchedule(hourly("project-a"), metadata=a)
        sid = theirs.schedule_id

        # B names A's id and an id nobody holds: answered alike, each a schedule of B's own.
        taken = await stub.CreateSchedule(hourly("project-b", sid), metadata=b)
        unknown = await stub.CreateSchedule(hourly("project-b", UNKNOWN), metadata=b)
        assert taken.schedule_id == sid and unknown.schedule_id == UNKNOWN
        assert taken.task == unknown.task and taken.cron == unknown.cron
        # ... and again: both are B's now, so both are ALREADY_EXISTS, with the same words.
        again = await refusal(stub.CreateSchedule(hourly("project-b", sid), metadata=b))
        again_unknown = await refusal(stub.CreateSchedule(hourly("project-b", UNKNOWN), metadata=b))
        assert again[0] == again_unknown[0] == grpc.StatusCode.ALREADY_EXISTS
        assert again[1].replace(sid, "X") == again_unknown[1].replace(UNKNOWN, "X")

        # Each tenant reads and changes its own; A's schedule is as A left it.
        get = pb.GetScheduleRequest(schedule_id=sid)
        assert await stub.GetSchedule(get, metadata=a) == theirs
        assert (await stub.GetSchedule(get, metadata=b)).task == taken.task
        pause = pb.UpdateScheduleRequest(
            schedule=pb.Schedule(schedule_id=sid, paused=True), update_mask=["paused"]
        )
        assert (await stub.UpdateSchedule(pause, metadata=b)).paused
        assert await stub.GetSchedule(get, metadata=a) == theirs
        resume = pb.UpdateScheduleRequest(
            schedule=pb.Schedule(schedule_id=sid, paused=False), update_mask=["paused"]
        )
        await stub.UpdateSchedule(resume, metadata=b)
        listed = await stub.ListSchedules(pb.ListSchedulesRequest(), metadata=b)
        assert sorted(s.schedule_id for s in listed.schedules) == sorted([sid, UNKNOWN])

        # Their slots start a workflow each, under different task ids; each tenant lists its
        # own under the schedule's id, and the schedule names it as its last.
        slot = max(
            [
                (await stub.GetSchedule(get, metadata=who)).next_fire_time.ToSeconds()
                for who in (a, b)
            ]
        )

        async def start(tid: str, spec: TaskSpec, schedule: tuple[str, datetime]) -> Any:
            return await engine.service.start(
                task_id=tid, holder_id="", idempotency_key=tid, task=spec, schedule=schedule
            )

        scheduler = Scheduler(
            pool=engine.pool,
            start=start,
            task_source=_NoTasks(),
            clock=ManualClock(start=slot + 1),
            interval_seconds=1,
            missed_after_seconds=7200,
        )
        assert await scheduler.sweep() == 3  # A's, B's under A's id, B's under the unknown one
        runs = {}
        for who, project in ((a, "project-a"), (b, "project-b")):
            found = await stub.ListWorkflows(pb.ListWorkflowsRequest(schedule_id=sid), metadata=who)
            assert len(found.workflows) == 1, project
            runs[project] = found.workflows[0].task_id
            last = (await stub.GetSchedule(get, metadata=who)).last_task_id
            assert last == runs[project]
        assert runs["project-a"] != runs["project-b"]

        # B deletes its own; A's is untouched, and B's id is unknown to B again.
        await stub.DeleteSchedule(pb.DeleteScheduleRequest(schedule_id=sid), metadata=b)
        code, _ = await refusal(stub.GetSchedule(get, metadata=b))
        assert code == grpc.StatusCode.NOT_FOUND
        assert (await stub.GetSchedule(get, metadata=a)).last_task_id == runs["project-a"]
    finally:
        await stop_engine(running)
