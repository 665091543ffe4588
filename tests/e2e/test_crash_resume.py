"""Kill -9 the engine while a step runs, start a new one, resume: every side effect once."""

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

pytestmark = pytest.mark.e2e


async def test_kill_9_mid_step_then_resume_runs_each_side_effect_once(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    side_effects = tmp_path / "side-effects.txt"
    data_dir = tmp_path / "data"  # shared: the new process re-attaches to the old one's jobs
    task_id = new_task_id()
    # Each step appends its name, then keeps running for a while: the kill lands mid-step,
    # after the side effect, so running the step again would show as a second line.
    spec = task(
        *(shell_step(f"step-{i}", f"echo step-{i} >> {side_effects}; sleep 1") for i in (1, 2, 3))
    )

    first = EngineProcess(db_url=db_url, data_dir=data_dir, holder_id="engine-1", ttl=3)
    processes.append(first)
    async with grpc.aio.insecure_channel(first.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        deadline = time.monotonic() + 30
        while "step-2" not in (side_effects.read_text() if side_effects.exists() else ""):
            assert time.monotonic() < deadline, "step-2 never started"
            await asyncio.sleep(0.02)
        first.kill()  # step-2's job is still sleeping

    # Recovery off: this test is about the orchestrator's ResumeWorkflow path.
    second = EngineProcess(
        db_url=db_url, data_dir=data_dir, holder_id="engine-2", ttl=3, recovery=False
    )
    processes.append(second)
    async with grpc.aio.insecure_channel(second.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        before = await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
        assert before.status == pb.RUNNING and before.lease_holder_id == "engine-1"
        # The dead process's lease must expire before another holder may take over.
        deadline = time.monotonic() + 30
        while True:
            try:
                resumed = await stub.ResumeWorkflow(
                    pb.ResumeWorkflowRequest(task_id=task_id, holder_id="engine-2")
                )
                break
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
                assert "engine-1" in (err.details() or "")
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
        assert resumed.resumed
        assert resumed.last_node_id in ("dispatch_step", "collect_result")
        assert resumed.status == pb.RUNNING
        wf = await wait_for_status(stub, task_id)

    assert wf.status == pb.SUCCEEDED, wf.error
    assert side_effects.read_text().split() == ["step-1", "step-2", "step-3"]
    assert dict(dict(wf.state)["attempts_by_step"]) == {"step-1": 1, "step-2": 1, "step-3": 1}


async def test_sigterm_drains_at_a_node_boundary_and_releases_the_lease(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    task_id = new_task_id()
    spec = task(shell_step("slow", "sleep 1"), shell_step("after", "true"))
    engine = EngineProcess(db_url=db_url, data_dir=tmp_path / "data", holder_id="draining")
    processes.append(engine)
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        await asyncio.sleep(0.3)
        assert engine.terminate() == 0
    engine.wait_for_log("drain_finished")

    replica = EngineProcess(
        db_url=db_url, data_dir=tmp_path / "data", holder_id="next", recovery=False
    )
    processes.append(replica)
    async with grpc.aio.insecure_channel(replica.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        drained = await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
        assert drained.status == pb.RUNNING
        assert drained.lease_holder_id == ""  # released: no need to wait for expiry
        assert drained.last_node_id in ("collect_result", "verify_step_result")
        resumed = await stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=task_id))
        assert resumed.resumed
        wf = await wait_for_status(stub, task_id)
    assert wf.status == pb.SUCCEEDED


async def test_kill_9_then_another_replica_recovers_it_without_being_asked(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    side_effects = tmp_path / "side-effects.txt"
    data_dir = tmp_path / "data"
    task_id = new_task_id()
    spec = task(
        *(shell_step(f"step-{i}", f"echo step-{i} >> {side_effects}; sleep 0.5") for i in (1, 2))
    )
    first = EngineProcess(db_url=db_url, data_dir=data_dir, holder_id="doomed", ttl=3)
    processes.append(first)
    survivor = EngineProcess(db_url=db_url, data_dir=data_dir, holder_id="survivor", ttl=3)
    processes.append(survivor)
    async with grpc.aio.insecure_channel(first.address) as channel:
        await pb_grpc.WorkflowEngineStub(channel).StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=spec)
        )
        while not side_effects.exists():
            await asyncio.sleep(0.02)
        first.kill()
    async with grpc.aio.insecure_channel(survivor.address) as channel:
        wf = await wait_for_status(pb_grpc.WorkflowEngineStub(channel), task_id, timeout=30)
    assert wf.status == pb.SUCCEEDED
    assert side_effects.read_text().split() == ["step-1", "step-2"]
    survivor.wait_for_log("recovered_workflows")
