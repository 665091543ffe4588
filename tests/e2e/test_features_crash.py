"""Approval and parallel steps survive kill -9 of the engine like the rest of the workflow."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, shell_step, step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e


async def test_kill_9_while_waiting_for_approval_then_approve_from_a_new_process(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    marker = tmp_path / "deployed.txt"
    task_id = new_task_id()
    spec = task(
        step("prepare", "echo", "ready"),
        shell_step("deploy", f"echo deployed >> {marker}", requires_approval=True),
    )
    first = EngineProcess(db_url=db_url, data_dir=tmp_path / "data", holder_id="engine-1")
    processes.append(first)
    async with grpc.aio.insecure_channel(first.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        await wait_for_status(stub, task_id, {pb.WAITING_FOR_APPROVAL})
    first.kill()

    second = EngineProcess(db_url=db_url, data_dir=tmp_path / "data", holder_id="engine-2")
    processes.append(second)
    async with grpc.aio.insecure_channel(second.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        waiting = await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
        assert waiting.status == pb.WAITING_FOR_APPROVAL
        assert waiting.pending_approval.step_id == "deploy"
        # The lease was released when the workflow paused: no waiting for it to expire.
        resumed = await stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(
                task_id=task_id,
                holder_id="engine-2",
                decision=pb.ApprovalDecision(step_id="deploy", verdict=pb.APPROVE),
            )
        )
        assert resumed.resumed
        done = await wait_for_status(stub, task_id)
    assert done.status == pb.SUCCEEDED, done.error
    assert marker.read_text() == "deployed\n"


async def test_kill_9_with_parallel_steps_in_flight_reruns_no_finished_step(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    effects = tmp_path / "effects.txt"
    data_dir = tmp_path / "data"  # shared: the new process re-attaches to the old one's jobs
    task_id = new_task_id()
    spec = task(
        shell_step("quick", f"echo quick >> {effects}"),
        shell_step("slow-1", f"echo slow-1 >> {effects}; sleep 3"),
        shell_step("slow-2", f"echo slow-2 >> {effects}; sleep 3"),
        shell_step("after", f"echo after >> {effects}", depends_on=["quick", "slow-1", "slow-2"]),
    )
    first = EngineProcess(db_url=db_url, data_dir=data_dir, holder_id="engine-1", ttl=3)
    processes.append(first)
    async with grpc.aio.insecure_channel(first.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        deadline = time.monotonic() + 30
        while True:  # until "quick" has passed (checkpointed) while the slow ones still run
            wf = await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
            steps = json_format.MessageToDict(wf.state).get("steps") or {}
            if steps.get("quick", {}).get("status") == "passed":
                break
            assert time.monotonic() < deadline, "quick never passed"
            await asyncio.sleep(0.02)
        assert {steps[s]["status"] for s in ("slow-1", "slow-2")} == {"dispatched"}
    first.kill()

    second = EngineProcess(
        db_url=db_url, data_dir=data_dir, holder_id="engine-2", ttl=3, recovery=False
    )
    processes.append(second)
    async with grpc.aio.insecure_channel(second.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        deadline = time.monotonic() + 30
        while True:  # the dead process's lease must expire first
            try:
                await stub.ResumeWorkflow(
                    pb.ResumeWorkflowRequest(task_id=task_id, holder_id="engine-2")
                )
                break
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
        done = await wait_for_status(stub, task_id)
    assert done.status == pb.SUCCEEDED, done.error
    lines = effects.read_text().splitlines()
    assert sorted(lines) == ["after", "quick", "slow-1", "slow-2"], lines  # each exactly once
    assert json_format.MessageToDict(done.state)["attempts_by_step"] == {
        "quick": 1,
        "slow-1": 1,
        "slow-2": 1,
        "after": 1,
    }
