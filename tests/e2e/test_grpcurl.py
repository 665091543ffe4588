"""An operator's view: grpcurl (from PyPI) finds the service by reflection and starts a task."""

from __future__ import annotations

import asyncio
import json
import sys
from asyncio.subprocess import PIPE
from pathlib import Path

import pytest

from tests.conftest import RunningEngine
from tests.support.helpers import new_task_id, wait_for_status

GRPCURL = Path(sys.executable).parent / "grpcurl"
pytestmark = pytest.mark.e2e


async def grpcurl(*args: str) -> str:
    # Asynchronously: the server under test runs on this test's event loop.
    proc = await asyncio.create_subprocess_exec(
        str(GRPCURL), "-plaintext", *args, stdout=PIPE, stderr=PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_grpcurl_lists_by_reflection_and_starts_a_workflow(running: RunningEngine) -> None:
    services = (await grpcurl(running.address, "list")).split()
    assert "workflow_engine.v1.WorkflowEngine" in services
    assert "grpc.health.v1.Health" in services
    methods = (await grpcurl(running.address, "list", "workflow_engine.v1.WorkflowEngine")).split()
    assert "workflow_engine.v1.WorkflowEngine.StartWorkflow" in methods

    task_id = new_task_id()
    request = {
        "task_id": task_id,
        "task": {
            "prompt": "two steps",
            "steps": [
                {"id": "hello", "command": ["echo", "hello"]},
                {
                    "id": "check",
                    "command": ["echo", "world"],
                    "expect": [{"kind": "stdout_contains", "value": "world"}],
                },
            ],
        },
    }
    out = json.loads(
        await grpcurl(
            "-d",
            json.dumps(request),
            running.address,
            "workflow_engine.v1.WorkflowEngine/StartWorkflow",
        )
    )
    assert out["status"] == "STARTED" and out["run_id"]
    await wait_for_status(running.stub, task_id)
    got = json.loads(
        await grpcurl(
            "-d",
            json.dumps({"task_id": task_id}),
            running.address,
            "workflow_engine.v1.WorkflowEngine/GetWorkflow",
        )
    )
    assert got["status"] == "SUCCEEDED" and got["last_node_id"] == "finalize_summary"
    health = json.loads(await grpcurl(running.address, "grpc.health.v1.Health/Check"))
    assert health["status"] == "SERVING"


async def test_grpcurl_health_list_answers_every_service(running: RunningEngine) -> None:
    methods = (await grpcurl(running.address, "list", "grpc.health.v1.Health")).split()
    assert "grpc.health.v1.Health.List" in methods
    answer = json.loads(await grpcurl(running.address, "grpc.health.v1.Health/List"))
    # grpcurl prints proto3 JSON, which leaves out the default ("UNKNOWN") status; both are set.
    assert answer["statuses"] == {
        "": {"status": "SERVING"},
        "workflow_engine.v1.WorkflowEngine": {"status": "SERVING"},
    }


async def test_grpcurl_describe_explains_the_contract_with_its_comments(
    running: RunningEngine,
) -> None:
    check = await grpcurl(running.address, "describe", "workflow_engine.v1.Check")
    assert "json_field_equals:  field (dotted path into stdout parsed as JSON)" in check
    verdict = await grpcurl(running.address, "describe", "workflow_engine.v1.Verdict")
    assert "// Do not run it: the step fails with `reason`, and so does the workflow." in verdict
    method = "workflow_engine.v1.WorkflowEngine.StartWorkflow"
    start = await grpcurl(running.address, "describe", method)
    assert "takes the task's lease" in start and "rpc StartWorkflow" in start
    # The well-known types and the other services are still described (without comments).
    assert "message Struct" in await grpcurl(running.address, "describe", "google.protobuf.Struct")
    assert "rpc Check" in await grpcurl(running.address, "describe", "grpc.health.v1.Health")
