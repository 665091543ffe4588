"""An approval request expires while no engine runs: its expiry is in the row, so the next
engine to start applies it (REJECT fails the workflow by actor "deadline"; SUSPEND suspends it,
and a resume asks again)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import psycopg
import pytest

from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, shell_step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

TIMER = {"WORKFLOW_ENGINE_TIMER_INTERVAL_SECONDS": "0.2"}
ENDED = {pb.SUCCEEDED, pb.FAILED, pb.CANCELLED, pb.SUSPENDED}


def gated(marker: Path, action: int) -> pb.TaskSpec:
    return task(
        shell_step(
            "deploy",
            f"echo deployed >> {marker}",
            requires_approval=True,
            approval_timeout_seconds=4,
            on_approval_timeout=action,
        )
    )


async def wake_times(db_url: str, task_ids: list[str]) -> list[tuple[str, float | None]]:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT status, extract(epoch FROM wake_at)::float8 FROM workflow_checkpoints"
            " WHERE task_id = ANY(%s::uuid[]) ORDER BY array_position(%s::uuid[], task_id)",
            (task_ids, task_ids),
        )
        return [(row[0], row[1]) for row in await cur.fetchall()]


async def test_an_expiry_that_passed_while_no_engine_ran_is_applied_by_the_next(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    marker = tmp_path / "deployed"
    rejected, suspended = new_task_id(), new_task_id()
    data_dir = tmp_path / "data"
    first = EngineProcess(db_url=db_url, data_dir=data_dir, holder_id="e1", extra_env=TIMER)
    processes.append(first)
    async with grpc.aio.insecure_channel(first.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        expiries = []
        for task_id, action in (
            (rejected, pb.ApprovalTimeout.REJECT),
            (suspended, pb.ApprovalTimeout.SUSPEND),
        ):
            await stub.StartWorkflow(
                pb.StartWorkflowRequest(task_id=task_id, task=gated(marker, action))
            )
            wf = await wait_for_status(stub, task_id, {pb.WAITING_FOR_APPROVAL})
            expiries.append(wf.pending_approval.expires_at.ToMicroseconds() / 1e6)
    assert first.terminate() == 0  # SIGTERM: it drains and stops

    # The expiry is in the row, and passes while nothing runs.
    rows = await wake_times(db_url, [rejected, suspended])
    assert [status for status, _ in rows] == ["WAITING_FOR_APPROVAL"] * 2
    assert [round(at or 0, 3) for _, at in rows] == [round(e, 3) for e in expiries]
    await asyncio.sleep(max(0.0, max(expiries) - time.time() + 0.5))
    assert [status for status, _ in await wake_times(db_url, [rejected, suspended])] == [
        "WAITING_FOR_APPROVAL"
    ] * 2

    second = EngineProcess(db_url=db_url, data_dir=data_dir, holder_id="e2", extra_env=TIMER)
    processes.append(second)
    async with grpc.aio.insecure_channel(second.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        failed = await wait_for_status(stub, rejected, ENDED, timeout=30)
        assert failed.status == pb.FAILED
        expired = [(e.actor, e.detail) for e in failed.history if e.kind == pb.APPROVAL_DECIDED]
        reason = "the approval request of step deploy expired after 4 s"
        assert expired == [("deadline", f"reject step deploy: {reason}")]
        paused = await wait_for_status(stub, suspended, ENDED, timeout=30)
        assert paused.status == pb.SUSPENDED
        assert reason in paused.summary
        # Neither row has a time to wake at any more.
        assert [at for _, at in await wake_times(db_url, [rejected, suspended])] == [None, None]

        await stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=suspended))
        again = await wait_for_status(stub, suspended, {pb.WAITING_FOR_APPROVAL}, timeout=30)
        assert again.pending_approval.expires_at.ToMicroseconds() / 1e6 > max(expiries)
        assert not marker.exists()
