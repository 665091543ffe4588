"""Case 10: client deadlines are honoured on every RPC; no session is left idle in transaction."""

from __future__ import annotations

import asyncio
import time

import grpc
import psycopg

from tests.chaos.conftest import record
from tests.conftest import RunningEngine
from tests.support.helpers import new_task_id, step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb


async def test_deadlines_are_honoured_and_leave_no_open_transaction(
    running: RunningEngine, db_url: str
) -> None:
    task_id = new_task_id()
    spec = task(step("slow", "sleep", "1.5"))
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    calls = {
        "StartWorkflow": lambda t: running.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=new_task_id(), task=spec), timeout=t
        ),
        "ResumeWorkflow": lambda t: running.stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(task_id=task_id), timeout=t
        ),
        "GetWorkflow": lambda t: running.stub.GetWorkflow(
            pb.GetWorkflowRequest(task_id=task_id), timeout=t
        ),
        "CancelWorkflow": lambda t: running.stub.CancelWorkflow(
            pb.CancelWorkflowRequest(task_id=new_task_id()), timeout=t
        ),
    }
    overrun = 0.0
    outcomes: dict[str, set[str]] = {}
    for name, make in calls.items():
        for deadline in (0.001, 0.01, 0.05):
            t0 = time.perf_counter()
            try:
                await make(deadline)
                code = "OK"
            except grpc.aio.AioRpcError as err:
                code = err.code().name
            overrun = max(overrun, time.perf_counter() - t0 - deadline)
            outcomes.setdefault(name, set()).add(code)
            assert code in ("OK", "DEADLINE_EXCEEDED", "NOT_FOUND"), (name, code)
    # A watch on a running workflow outlives a short deadline: it must end at the deadline.
    t0 = time.perf_counter()
    watch = running.stub.WatchWorkflow(pb.WatchWorkflowRequest(task_id=task_id), timeout=0.5)
    try:
        async for _ in watch:
            pass
        code = "OK"
    except grpc.aio.AioRpcError as err:
        code = err.code().name
    watch_seconds = time.perf_counter() - t0
    assert code == "DEADLINE_EXCEEDED"

    await wait_for_status(running.stub, task_id)
    await asyncio.sleep(0.2)
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND state LIKE 'idle in transaction%%'"
        )
        (idle_in_tx,) = await cur.fetchone()
    record(
        "10 deadlines",
        rpcs_with_deadlines=len(calls) * 3 + 1,
        worst_overrun_ms=round(overrun * 1000, 1),
        watch_ended_after_s=round(watch_seconds, 2),
        sessions_idle_in_transaction=idle_in_tx,
    )
    assert watch_seconds < 2.0
    assert idle_in_tx == 0
