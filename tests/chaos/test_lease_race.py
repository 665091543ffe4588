"""Case 4: many concurrent starts for one task from as many holders: exactly one winner."""

from __future__ import annotations

import asyncio
import statistics
import time

import grpc

from tests.chaos.conftest import record, scale
from tests.conftest import RunningEngine
from tests.support.helpers import new_task_id, step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb


async def test_concurrent_starts_have_one_winner(running: RunningEngine) -> None:
    contenders = scale(20, 50)
    rounds = scale(2, 5)
    winners_per_round, latencies = [], []
    for _ in range(rounds):
        task_id = new_task_id()
        spec = task(step("hold", "sleep", "0.5"))

        async def start(holder: str, task_id: str = task_id, spec: pb.TaskSpec = spec) -> bool:
            t0 = time.perf_counter()
            try:
                await running.stub.StartWorkflow(
                    pb.StartWorkflowRequest(task_id=task_id, holder_id=holder, task=spec)
                )
                return True
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
                return False
            finally:
                latencies.append(time.perf_counter() - t0)

        outcomes = await asyncio.gather(*(start(f"holder-{i}") for i in range(contenders)))
        winners_per_round.append(sum(outcomes))
        await wait_for_status(running.stub, task_id)
    latencies.sort()
    record(
        "4 lease race",
        contenders=contenders,
        rounds=rounds,
        winners_per_round=winners_per_round,
        acquire_p50_ms=round(statistics.median(latencies) * 1000, 1),
        acquire_p99_ms=round(latencies[int(0.99 * (len(latencies) - 1))] * 1000, 1),
    )
    assert winners_per_round == [1] * rounds
