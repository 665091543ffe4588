"""Case 5: the database drops every engine connection, then restarts, mid-run."""

from __future__ import annotations

import asyncio
import os
import time

import grpc
import psycopg
import pytest

from tests.chaos.conftest import record, scale
from tests.conftest import EMBEDDED_PGDATA, RunningEngine
from tests.support.helpers import new_task_id, shell_step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb

pytestmark = pytest.mark.chaos_full

TERMINATE = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


async def restart_postgres() -> None:
    from pgserver._commands import pg_ctl  # the embedded server's own pg_ctl

    await asyncio.to_thread(
        pg_ctl, ["restart", "-m", "fast", "-w"], pgdata=EMBEDDED_PGDATA, user="pgserver"
    )


async def test_workflows_survive_connection_loss_and_restart(
    running: RunningEngine, db_url: str
) -> None:
    if os.environ.get("WORKFLOW_ENGINE_TEST_DATABASE_URL") or os.geteuid() != 0:
        pytest.skip("restarts the embedded server, which needs root to act as its user")
    count = scale(5, 20)
    spec = task(*(shell_step(f"s{i}", "sleep 1") for i in range(3)))
    task_ids = [new_task_id() for _ in range(count)]
    for t in task_ids:
        await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=t, task=spec))
    codes: dict[str, int] = {}
    stop = asyncio.Event()

    async def poll() -> None:  # a client reading throughout: only OK or UNAVAILABLE allowed
        while not stop.is_set():
            try:
                await running.stub.GetWorkflow(
                    pb.GetWorkflowRequest(task_id=task_ids[0]), timeout=5
                )
                codes["OK"] = codes.get("OK", 0) + 1
            except grpc.aio.AioRpcError as err:
                codes[err.code().name] = codes.get(err.code().name, 0) + 1
            await asyncio.sleep(0.05)

    async def first_success_after(t0: float) -> float:
        while True:
            try:
                await running.stub.GetWorkflow(
                    pb.GetWorkflowRequest(task_id=task_ids[0]), timeout=5
                )
                return time.monotonic() - t0
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.05)

    poller = asyncio.create_task(poll())
    await asyncio.sleep(0.7)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        t0 = time.monotonic()
        (terminated,) = await (await conn.execute(TERMINATE)).fetchone()
    after_terminate = await first_success_after(t0)
    await asyncio.sleep(0.5)
    t1 = time.monotonic()
    await restart_postgres()
    after_restart = await first_success_after(t1)
    finished = 0
    for t in task_ids:
        wf = await wait_for_status(running.stub, t, timeout=90)
        finished += wf.status == pb.SUCCEEDED
    stop.set()
    await poller
    record(
        "5 database loss",
        workflows=count,
        backends_terminated=terminated,
        reconnect_after_terminate_s=round(after_terminate, 2),
        reconnect_after_restart_s=round(after_restart, 2),
        finished_share=round(finished / count, 3),
        client_codes=str(codes),
    )
    assert finished == count
    assert set(codes) <= {"OK", "UNAVAILABLE"}
