"""Human approval: a step that requires it pauses the workflow until a decision arrives."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import psycopg
import pytest

from tests.conftest import RunningEngine
from tests.support.helpers import new_task_id, shell_step, step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb

PAUSED = {pb.WAITING_FOR_APPROVAL}


def gated_task(marker: Path) -> pb.TaskSpec:
    return task(
        step("prepare", "echo", "ready"),
        shell_step("deploy", f"echo deployed >> {marker}", requires_approval=True),
    )


async def wait_paused(running: RunningEngine, task_id: str) -> pb.Workflow:
    return await wait_for_status(running.stub, task_id, PAUSED)


async def start_paused(running: RunningEngine, marker: Path) -> tuple[str, pb.Workflow]:
    """Start `gated_task` and wait until it waits for approval; its id and the paused workflow."""
    task_id = new_task_id()
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=gated_task(marker))
    )
    return task_id, await wait_paused(running, task_id)


def resume(task_id: str, **decision: object) -> pb.ResumeWorkflowRequest:
    return pb.ResumeWorkflowRequest(task_id=task_id, decision=pb.ApprovalDecision(**decision))


async def lease_of(db_url: str, task_id: str) -> tuple[object, ...] | None:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT holder_id, expires_at > now() FROM task_workflow_leases WHERE task_id = %s",
            (task_id,),
        )
        return await cur.fetchone()


async def test_pause_holds_the_request_releases_the_lease_and_approve_finishes(
    running: RunningEngine, db_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "deployed.txt"
    task_id = new_task_id()
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=gated_task(marker))
    )
    wf = await wait_paused(running, task_id)

    assert wf.pending_approval.step_id == "deploy"
    assert "echo deployed" in wf.pending_approval.command[-1]
    assert "requires approval" in wf.pending_approval.reason
    assert not marker.exists()  # nothing ran
    for _ in range(100):  # the run releases the lease right after its last checkpoint
        lease = await lease_of(db_url, task_id)
        if lease is not None and lease[0] is None:
            break
        await asyncio.sleep(0.05)
    assert lease == (None, None)  # released while waiting
    kinds = [e.kind for e in wf.history]
    assert pb.APPROVAL_REQUESTED in kinds

    await running.stub.ResumeWorkflow(
        resume(task_id, step_id="deploy", verdict=pb.APPROVE, decided_by="alice")
    )
    done = await wait_for_status(running.stub, task_id)
    assert done.status == pb.SUCCEEDED, done.error
    assert marker.read_text() == "deployed\n"
    decided = [e for e in done.history if e.kind == pb.APPROVAL_DECIDED]
    assert [(e.actor, e.detail) for e in decided] == [("alice", "approve step deploy")]
    assert dict(done.state["approvals"])["deploy"]["decided_by"] == "alice"


async def test_reject_fails_the_step_with_the_reason(
    running: RunningEngine, tmp_path: Path
) -> None:
    marker = tmp_path / "deployed.txt"
    task_id = new_task_id()
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=gated_task(marker))
    )
    await wait_paused(running, task_id)
    await running.stub.ResumeWorkflow(
        resume(task_id, step_id="deploy", verdict=pb.REJECT, reason="not on a Friday")
    )
    done = await wait_for_status(running.stub, task_id)
    assert done.status == pb.FAILED
    assert "step deploy" in done.error and "not on a Friday" in done.error
    assert not marker.exists()


async def test_edit_runs_the_edited_command(running: RunningEngine, tmp_path: Path) -> None:
    marker = tmp_path / "deployed.txt"
    task_id = new_task_id()
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=gated_task(marker))
    )
    await wait_paused(running, task_id)
    await running.stub.ResumeWorkflow(
        resume(
            task_id,
            step_id="deploy",
            verdict=pb.EDIT,
            command=["/bin/sh", "-c", f'echo "edited $TARGET" >> {marker}'],
            env={"TARGET": "staging"},
        )
    )
    done = await wait_for_status(running.stub, task_id)
    assert done.status == pb.SUCCEEDED, done.error
    assert marker.read_text() == "edited staging\n"


@pytest.mark.parametrize(
    ("decision", "phrase"),
    [
        ({"step_id": "prepare", "verdict": pb.APPROVE}, "not 'prepare'"),  # not the pending one
        ({"step_id": "nope", "verdict": pb.APPROVE}, "not 'nope'"),
    ],
)
async def test_a_decision_matching_no_pending_request_is_refused(
    running: RunningEngine, tmp_path: Path, decision: dict[str, object], phrase: str
) -> None:
    task_id, before = await start_paused(running, tmp_path / "m")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await running.stub.ResumeWorkflow(resume(task_id, **decision))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert phrase in (err.value.details() or "")
    after = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert after.status == pb.WAITING_FOR_APPROVAL
    assert after.updated_at == before.updated_at and len(after.history) == len(before.history)


async def test_a_second_decision_and_a_decision_for_a_running_workflow_are_refused(
    running: RunningEngine, tmp_path: Path
) -> None:
    task_id, _ = await start_paused(running, tmp_path / "m")
    await running.stub.ResumeWorkflow(resume(task_id, step_id="deploy", verdict=pb.APPROVE))
    done = await wait_for_status(running.stub, task_id)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await running.stub.ResumeWorkflow(resume(task_id, step_id="deploy", verdict=pb.APPROVE))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no pending approval" in (err.value.details() or "")
    after = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert after.updated_at == done.updated_at

    plain = new_task_id()
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=plain, task=task(step("slow", "sleep", "1")))
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await running.stub.ResumeWorkflow(resume(plain, step_id="slow", verdict=pb.APPROVE))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_resume_without_a_decision_is_refused_while_waiting(
    running: RunningEngine, tmp_path: Path
) -> None:
    task_id, _ = await start_paused(running, tmp_path / "m")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await running.stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=task_id))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (err.value.details() or "").startswith("decision: required")


@pytest.mark.parametrize(
    ("decision", "field"),
    [
        ({"step_id": "deploy"}, "decision.verdict"),
        ({"verdict": pb.APPROVE}, "decision.step_id"),
        ({"step_id": "deploy", "verdict": pb.REJECT}, "decision.reason"),
        ({"step_id": "deploy", "verdict": pb.EDIT}, "decision.command"),
        ({"step_id": "deploy", "verdict": pb.APPROVE, "command": ["x"]}, "decision.command"),
        ({"step_id": "deploy", "verdict": pb.EDIT, "command": ["a\x00b"]}, "decision.command[0]"),
    ],
)
async def test_malformed_decisions_are_invalid_argument_naming_the_field(
    running: RunningEngine, tmp_path: Path, decision: dict[str, object], field: str
) -> None:
    task_id, before = await start_paused(running, tmp_path / "m")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await running.stub.ResumeWorkflow(resume(task_id, **decision))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(field)
    after = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert after.updated_at == before.updated_at
