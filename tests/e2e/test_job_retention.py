"""The served engine removes its finished jobs' directories after the retention; the
workflow's results, in its checkpoint, stay."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest

from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, shell_step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc


def job_dirs(jobs: Path) -> list[Path]:
    """The job directories (not the record of the tasks' users, `.users`)."""
    return [p for p in jobs.iterdir() if not p.name.startswith(".")]


pytestmark = pytest.mark.e2e


async def test_the_engine_prunes_job_directories_after_their_retention(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    data_dir = tmp_path / "data"
    engine = EngineProcess(
        db_url=db_url,
        data_dir=data_dir,
        holder_id="engine-1",
        extra_env={"WORKFLOW_ENGINE_JOB_RETENTION_SECONDS": "2"},
    )
    processes.append(engine)
    task_id = new_task_id()
    spec = task(shell_step("one", "echo first"), shell_step("two", "echo second"))
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        done = await wait_for_status(stub, task_id)
        assert done.status == pb.SUCCEEDED
        jobs = data_dir / "jobs"
        assert len(job_dirs(jobs)) == 2  # one directory per step's job
        deadline = time.monotonic() + 20
        while job_dirs(jobs):
            assert time.monotonic() < deadline, f"left: {job_dirs(jobs)}"
            await asyncio.sleep(0.1)
        # The round logs once it has removed them: its line may come a moment after.
        while engine.count("job_dirs_pruned") < 1:
            assert time.monotonic() < deadline, "no job_dirs_pruned line"
            await asyncio.sleep(0.1)
        after = await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert after.status == pb.SUCCEEDED
    assert after == done
