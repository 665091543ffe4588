"""Kill -9 around the model's plan: a checkpointed plan is never asked for again; a plan the
engine died holding (before its checkpoint) is asked for once more."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, wait_for_status
from tests.support.model_server import API_KEY, MODEL, ModelServer
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

PLAN = {
    "steps": [
        {
            "id": "health",
            "command": ["echo", "HTTP 200 OK"],
            "expect": [{"kind": "stdout_contains", "value": "200"}],
        }
    ],
    "assumptions": [],
}


def llm_env(model: ModelServer, tmp_path: Path) -> dict[str, str]:
    policy = tmp_path / "policy.yaml"
    policy.write_text("allow: [echo]\n")
    return {
        "WORKFLOW_ENGINE_PLANNER": "llm",
        "WORKFLOW_ENGINE_VERIFIER": "llm",
        "WORKFLOW_ENGINE_LLM_BASE_URL": model.base_url,
        "WORKFLOW_ENGINE_LLM_MODEL": MODEL,
        "WORKFLOW_ENGINE_LLM_API_KEY": API_KEY,
        "WORKFLOW_ENGINE_COMMAND_POLICY_FILE": str(policy),
    }


@pytest.mark.parametrize(("point", "plans"), [("after", 1), ("before", 2)])
async def test_kill_9_around_the_plan_then_recovery_finishes(
    db_url: str,
    tmp_path: Path,
    processes: list[EngineProcess],
    model: ModelServer,
    point: str,
    plans: int,
) -> None:
    model.script("plan", PLAN, PLAN)
    env = llm_env(model, tmp_path)
    data_dir = tmp_path / "data"
    task_id = new_task_id()
    first = EngineProcess(
        db_url=db_url,
        data_dir=data_dir,
        holder_id="engine-1",
        ttl=2,
        faults=f"kill:{point}:plan_steps",
        extra_env=env,
    )
    processes.append(first)
    async with grpc.aio.insecure_channel(first.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        spec = pb.TaskSpec(prompt="Add a health endpoint and prove it answers 200")
        await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    assert first.proc.wait(30) == -9  # the fault killed it right around the plan's checkpoint

    # Another engine adopts the workflow once the dead one's lease expires.
    second = EngineProcess(db_url=db_url, data_dir=data_dir, holder_id="engine-2", extra_env=env)
    processes.append(second)
    async with grpc.aio.insecure_channel(second.address) as channel:
        wf = await wait_for_status(pb_grpc.WorkflowEngineStub(channel), task_id)

    assert wf.status == pb.SUCCEEDED, wf.error
    assert len(model.asked("plan")) == plans
    state = json_format.MessageToDict(wf.state)
    assert [c["purpose"] for c in state["model_calls"]] == ["plan", "verify"]
