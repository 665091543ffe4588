"""Kill -9 the engine while its job runs on a worker node; the next engine gets the same job.

The node (`TheirWorkerNode`, in this process) deduplicates by job id, as the Worker API
prescribes: the new engine re-sends the job id recorded in the checkpoint to the node recorded
there, and receives the running (or finished) job's result. The command ran once.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, step, task, wait_for_status, write_secret
from tests.support.their_worker_node import TheirWorkerNode, nodes_file_entry
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e


@pytest.fixture
def node() -> Iterator[TheirWorkerNode]:
    served = TheirWorkerNode(name="node-1", token="e2e-token").serve()
    yield served
    served.stop()


async def test_kill_9_mid_job_then_the_next_engine_re_attaches_by_job_id(
    db_url: str, tmp_path: Path, node: TheirWorkerNode, processes: list[EngineProcess]
) -> None:
    write_secret(tmp_path / "token", "e2e-token")
    nodes_file = tmp_path / "nodes.json"
    nodes_file.write_text(json.dumps([nodes_file_entry(node, str(tmp_path / "token"))]))
    env = {
        "WORKFLOW_ENGINE_WORKER": "nodes",
        "WORKFLOW_ENGINE_NODES_FILE": str(nodes_file),
        "WORKFLOW_ENGINE_NODES_HEALTH_INTERVAL_SECONDS": "0.5",
    }
    task_id = new_task_id()
    spec = task(step("slow", "sh", "-c", "sleep 3; echo done"))

    first = EngineProcess(
        db_url=db_url, data_dir=tmp_path / "a", holder_id="engine-1", ttl=2, extra_env=env
    )
    processes.append(first)
    async with grpc.aio.insecure_channel(first.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        deadline = time.monotonic() + 30
        while not node.running:
            assert time.monotonic() < deadline, "the job never started on the node"
            await asyncio.sleep(0.02)
    (job_id,) = node.running
    first.kill()  # mid-job: its request is cut off, the job runs on

    # Another engine (its own data directory: nothing local is shared) adopts the workflow
    # once the dead one's lease expires.
    second = EngineProcess(
        db_url=db_url, data_dir=tmp_path / "b", holder_id="engine-2", ttl=2, extra_env=env
    )
    processes.append(second)
    async with grpc.aio.insecure_channel(second.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        workflow = await wait_for_status(stub, task_id, timeout=60)
    assert workflow.status == pb.SUCCEEDED, workflow.error
    state = json_format.MessageToDict(workflow.state)
    result = state["steps"]["slow"]["result"]
    assert (result["job_id"], result["stdout"], result["target"]) == (job_id, "done\n", "node-1")
    assert node.runs[job_id] == 1  # ran once...
    assert node.requests[job_id] == 2  # ...though each engine sent it
    assert state["attempts_by_step"] == {"slow": 1}
