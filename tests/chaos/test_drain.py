"""Case 7: SIGTERM drains a replica: NOT_SERVING at once, no in-flight RPC fails, another adopts."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.chaos.conftest import record, scale
from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, shell_step, task
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.chaos_full]


async def test_sigterm_drain(db_url: str, tmp_path: Path) -> None:
    count = scale(5, 20)
    spec = task(shell_step("a", "sleep 1"), shell_step("b", "sleep 1"))
    draining = EngineProcess(db_url=db_url, data_dir=tmp_path / "data", holder_id="draining")
    adopter = EngineProcess(db_url=db_url, data_dir=tmp_path / "data", holder_id="adopter")
    task_ids = [new_task_id() for _ in range(count)]
    try:
        async with grpc.aio.insecure_channel(draining.address) as channel:
            stub = pb_grpc.WorkflowEngineStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            await asyncio.gather(
                *(
                    stub.StartWorkflow(pb.StartWorkflowRequest(task_id=t, task=spec))
                    for t in task_ids
                )
            )
            await asyncio.sleep(0.5)
            in_flight = [
                asyncio.ensure_future(stub.GetWorkflow(pb.GetWorkflowRequest(task_id=t)))
                for t in task_ids
            ]
            t0 = time.monotonic()
            draining.proc.send_signal(signal.SIGTERM)
            not_serving = None
            while not_serving is None and time.monotonic() - t0 < 10:
                try:
                    answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                    if answer.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                        not_serving = time.monotonic() - t0
                except grpc.aio.AioRpcError:
                    not_serving = time.monotonic() - t0  # already gone counts as not serving
                await asyncio.sleep(0.005)
            results = await asyncio.gather(*in_flight, return_exceptions=True)
            failed = sum(isinstance(r, BaseException) for r in results)
        async with grpc.aio.insecure_channel(adopter.address) as channel:
            stub = pb_grpc.WorkflowEngineStub(channel)
            adopted_at = None
            while adopted_at is None and time.monotonic() - t0 < 60:
                workflows = [
                    await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=t)) for t in task_ids
                ]
                if all(
                    w.lease_holder_id == "adopter" or w.status == pb.SUCCEEDED for w in workflows
                ):
                    adopted_at = time.monotonic() - t0
                await asyncio.sleep(0.1)
        record(
            "7 SIGTERM drain",
            workflows=count,
            seconds_to_not_serving=round(not_serving or -1, 3),
            in_flight_rpcs_failed=failed,
            seconds_until_adopted=round(adopted_at or -1, 2),
            exit_code=draining.proc.wait(30),
        )
        assert not_serving is not None and failed == 0 and adopted_at is not None
    finally:
        draining.kill() if draining.proc.poll() is None else None
        adopter.kill()
