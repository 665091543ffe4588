"""The served engine's default worker, the local sandbox, runs a step only as it asked to run:
a task whose step requires worker-node labels is refused at StartWorkflow, naming the field,
and nothing of it is stored or run."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, shell_step, task
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e


async def test_a_step_requiring_labels_is_refused_at_start_on_the_local_sandbox(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    engine = EngineProcess(db_url=db_url, data_dir=tmp_path / "data", holder_id="engine-1")
    processes.append(engine)
    marker = tmp_path / "ran"
    task_id = new_task_id()
    spec = task(shell_step("gpu", f"touch {marker}", required_labels=["gpu"]))
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == (
            "task.steps[0].required_labels: the local sandbox has no labels, and the step "
            "requires gpu; leave `required_labels` empty, or run the engine with worker nodes "
            "(WORKFLOW_ENGINE_WORKER=nodes)"
        )
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert not marker.exists()
