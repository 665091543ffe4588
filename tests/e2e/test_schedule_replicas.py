"""Two `workflow-engine serve` processes on one database fire one schedule: each slot starts
exactly one workflow, none is missed, and each succeeds."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import grpc
import psycopg

from tests.support.engine_process import EngineProcess
from tests.support.helpers import step, task
from workflow_engine.domain.schedules import slot_task_id
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

QUICK = {"WORKFLOW_ENGINE_TIMER_INTERVAL_SECONDS": "0.2"}
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


async def started_slots(db_url: str, schedule_id: str) -> list[tuple[float, str, str]]:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT extract(epoch FROM schedule_slot)::float8, task_id::text, status"
            " FROM workflow_checkpoints WHERE schedule_id = %s ORDER BY schedule_slot",
            (schedule_id,),
        )
        return [(row[0], row[1], row[2]) for row in await cur.fetchall()]


async def test_two_engines_fire_every_slot_once_and_miss_none(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    for name in ("engine-1", "engine-2"):
        processes.append(
            EngineProcess(db_url=db_url, data_dir=tmp_path / name, holder_id=name, extra_env=QUICK)
        )
    async with grpc.aio.insecure_channel(processes[0].address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        created = await stub.CreateSchedule(
            pb.CreateScheduleRequest(
                schedule=pb.Schedule(cron="@every 2s", task=task(step("hi", "echo", "hi")))
            )
        )
        sid = created.schedule_id
        await asyncio.sleep(20)
        await stub.UpdateSchedule(
            pb.UpdateScheduleRequest(
                schedule=pb.Schedule(schedule_id=sid, paused=True), update_mask=["paused"]
            )
        )
        # A pass that read the schedule before the pause may still start its slot (and then
        # fail to move the schedule on): let such a pass end before counting.
        await asyncio.sleep(2)
        deadline = time.monotonic() + 30
        rows = await started_slots(db_url, sid)
        while any(row[2] not in TERMINAL for row in rows):
            assert time.monotonic() < deadline, rows
            await asyncio.sleep(0.2)
            rows = await started_slots(db_url, sid)
        listed = await stub.ListWorkflows(pb.ListWorkflowsRequest(schedule_id=sid, page_size=500))
    slots = [row[0] for row in rows]
    assert len(slots) >= 9, rows
    assert [b - a for a, b in itertools.pairwise(slots)] == [2.0] * (len(slots) - 1)
    assert [row[1] for row in rows] == [slot_task_id(sid, slot) for slot in slots]
    assert {row[2] for row in rows} == {"SUCCEEDED"}
    assert {w.task_id for w in listed.workflows} == {row[1] for row in rows}
