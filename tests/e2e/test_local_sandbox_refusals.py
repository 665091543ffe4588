"""The served engine's default worker, the local sandbox, runs a step only as it asked to run:
a step that requires worker-node labels fails with a finding saying why, and never runs."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests.e2e.process import EngineProcess
from tests.helpers import new_task_id, shell_step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e


async def test_a_step_requiring_labels_fails_on_the_local_sandbox_and_never_runs(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    engine = EngineProcess(db_url=db_url, data_dir=tmp_path / "data", holder_id="engine-1")
    processes.append(engine)
    marker = tmp_path / "ran"
    task_id = new_task_id()
    spec = task(shell_step("gpu", f"touch {marker}", required_labels=["gpu"]))
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        done = await wait_for_status(stub, task_id)
    assert done.status == pb.FAILED
    assert "the local sandbox has no labels, and the step requires gpu" in done.error
    assert not marker.exists()
