"""Case 2: kill -9 one of two replicas running many workflows; the survivor finishes them."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from tests.chaos.conftest import record, scale
from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, shell_step, task
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.chaos_full]


async def test_survivor_finishes_every_workflow_of_a_killed_replica(
    db_url: str, tmp_path: Path
) -> None:
    count = scale(10, 50)
    jobs = tmp_path / "jobs.txt"
    jobs.touch()
    jobs.chmod(0o666)  # every task's jobs append here, each task's as a user of its own
    spec = task(
        *(shell_step(f"s{i}", f'echo "$WORKFLOW_ENGINE_JOB_ID" >> {jobs}; sleep 1') for i in (1, 2))
    )
    victim = EngineProcess(db_url=db_url, data_dir=tmp_path / "data", holder_id="victim", ttl=3)
    survivor = EngineProcess(db_url=db_url, data_dir=tmp_path / "data", holder_id="survivor", ttl=3)
    task_ids = [new_task_id() for _ in range(count)]
    try:
        async with grpc.aio.insecure_channel(victim.address) as channel:
            stub = pb_grpc.WorkflowEngineStub(channel)
            await asyncio.gather(
                *(
                    stub.StartWorkflow(pb.StartWorkflowRequest(task_id=t, task=spec))
                    for t in task_ids
                )
            )
        await asyncio.sleep(0.5)
        victim.kill()
        t0 = time.monotonic()
        async with grpc.aio.insecure_channel(survivor.address) as channel:
            stub = pb_grpc.WorkflowEngineStub(channel)
            pending = set(task_ids)
            while pending and time.monotonic() - t0 < 120:
                for t in list(pending):
                    wf = await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=t))
                    if wf.status == pb.SUCCEEDED:
                        pending.discard(t)
                await asyncio.sleep(0.2)
        seconds = time.monotonic() - t0
        runs = Counter(jobs.read_text().split())
        duplicates = sum(n - 1 for n in runs.values())
        record(
            "2 automatic recovery",
            workflows=count,
            finished_by_survivor=count - len(pending),
            seconds_until_all_finished=round(seconds, 1),
            duplicate_job_runs=duplicates,
        )
        assert not pending
        assert duplicates == 0
        assert len(runs) == 2 * count
    finally:
        victim.kill()
        survivor.kill()
