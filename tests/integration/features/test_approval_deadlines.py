"""Approval requests that expire and deadlines that hold while a workflow waits (issue 52), on
a real engine and database with short timeouts: REJECT fails the step and the workflow, by
actor "deadline"; SUSPEND suspends it with the reason, and resuming asks again; the workflow's
deadline suspends a waiting workflow; a decision at the instant of expiry and the expiry are
applied exactly once between them; bad values are INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import grpc
import psycopg
import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.helpers import new_task_id, shell_step, step, task, wait_for_status
from workflow_engine.config import Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb

WAITING = {pb.WAITING_FOR_APPROVAL}
ENDED = {pb.SUCCEEDED, pb.FAILED, pb.CANCELLED, pb.SUSPENDED}
REJECT = pb.ApprovalTimeout.REJECT
SUSPEND = pb.ApprovalTimeout.SUSPEND


@pytest.fixture
async def timely(settings: Settings) -> AsyncIterator[RunningEngine]:
    """An engine whose timer sweep looks every 50 ms."""
    replica = await start_engine(replace(settings, timer_interval_seconds=0.05))
    try:
        yield replica
    finally:
        await stop_engine(replica)


def gated(marker: Path, **approval: object) -> pb.TaskSpec:
    return task(
        step("prepare", "true"),
        shell_step("deploy", f"echo deployed >> {marker}", requires_approval=True, **approval),
    )


async def start_waiting(
    running: RunningEngine, spec: pb.TaskSpec, **kw: object
) -> tuple[str, pb.Workflow]:
    task_id = new_task_id()
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec, **kw))
    return task_id, await wait_for_status(running.stub, task_id, WAITING)


def decided(wf: pb.Workflow) -> list[tuple[str, str]]:
    return [(e.actor, e.detail) for e in wf.history if e.kind == pb.APPROVAL_DECIDED]


async def test_reject_on_expiry_fails_the_step_by_actor_deadline(
    timely: RunningEngine, tmp_path: Path
) -> None:
    marker = tmp_path / "deployed"
    task_id, wf = await start_waiting(timely, gated(marker, approval_timeout_seconds=1))
    request = wf.pending_approval
    assert request.on_timeout == REJECT
    waited = request.expires_at.ToMicroseconds() - request.requested_at.ToMicroseconds()
    assert waited == 1_000_000
    done = await wait_for_status(timely.stub, task_id, ENDED, timeout=20)
    assert done.status == pb.FAILED
    assert "the approval request of step deploy expired after 1 s" in done.error
    assert decided(done) == [
        ("deadline", "reject step deploy: the approval request of step deploy expired after 1 s")
    ]
    assert dict(done.state["approvals"])["deploy"]["decided_by"] == "deadline"
    assert not marker.exists()


async def test_suspend_on_expiry_then_resume_asks_again_with_a_new_expiry(
    timely: RunningEngine, tmp_path: Path
) -> None:
    marker = tmp_path / "deployed"
    # The task's default action, and the step's own timeout.
    spec = gated(marker, approval_timeout_seconds=1)
    spec.on_approval_timeout = SUSPEND
    task_id, wf = await start_waiting(timely, spec)
    assert wf.pending_approval.on_timeout == SUSPEND
    first_expiry = wf.pending_approval.expires_at.ToMicroseconds()
    suspended = await wait_for_status(timely.stub, task_id, ENDED, timeout=20)
    assert suspended.status == pb.SUSPENDED
    assert "the approval request of step deploy expired after 1 s" in suspended.summary
    assert "asks for approval again" in suspended.summary
    assert [a for a, _ in decided(suspended)] == ["deadline"]

    # No budget needed: the step asks again, with a new expiry.
    await timely.stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=task_id))
    again = await wait_for_status(timely.stub, task_id, WAITING, timeout=20)
    assert again.pending_approval.step_id == "deploy"
    assert again.pending_approval.expires_at.ToMicroseconds() > first_expiry
    await timely.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(
            task_id=task_id,
            decision=pb.ApprovalDecision(step_id="deploy", verdict=pb.APPROVE, decided_by="bo"),
        )
    )
    done = await wait_for_status(timely.stub, task_id, timeout=20)
    assert done.status == pb.SUCCEEDED, done.error
    assert marker.read_text() == "deployed\n"


async def test_the_workflow_deadline_suspends_a_waiting_workflow(
    timely: RunningEngine, tmp_path: Path
) -> None:
    spec = gated(tmp_path / "m", approval_timeout_seconds=3600)
    spec.budget.deadline_seconds = 2
    task_id, wf = await start_waiting(timely, spec)
    assert wf.pending_approval.on_timeout == SUSPEND  # the deadline comes first
    suspended = await wait_for_status(timely.stub, task_id, ENDED, timeout=20)
    assert suspended.status == pb.SUSPENDED
    assert "the deadline of 2 s after the start passed while step deploy waited" in (
        suspended.summary
    )
    # As today: resuming needs the deadline raised; then the step asks again.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await timely.stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=task_id))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await timely.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(task_id=task_id, budget=pb.Budget(deadline_seconds=7200))
    )
    again = await wait_for_status(timely.stub, task_id, WAITING, timeout=20)
    assert again.pending_approval.on_timeout == REJECT


async def test_a_request_without_a_timeout_never_expires(
    timely: RunningEngine, tmp_path: Path
) -> None:
    task_id, wf = await start_waiting(timely, gated(tmp_path / "m"))
    assert not wf.pending_approval.HasField("expires_at")
    assert wf.pending_approval.on_timeout == pb.ApprovalTimeout.ACTION_UNSPECIFIED
    await asyncio.sleep(0.5)
    still = await timely.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert still.status == pb.WAITING_FOR_APPROVAL
    assert still.updated_at == wf.updated_at


async def test_a_decision_at_the_instant_of_expiry_50_times_one_outcome_each(
    timely: RunningEngine, tmp_path: Path
) -> None:
    """50 waits, each answered APPROVE at (about) the instant it expires: either the approval
    ran the step (SUCCEEDED, no expiry recorded) or the expiry failed it (FAILED, the approval
    refused FAILED_PRECONDITION); never both, never neither."""
    spec = task(
        shell_step("deploy", "true", requires_approval=True, approval_timeout_seconds=2),
    )

    async def race(i: int) -> tuple[str, bool]:
        task_id = new_task_id()
        await timely.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        wf = await wait_for_status(timely.stub, task_id, WAITING | ENDED)
        # On a busy machine the 2 s can pass before this poll sees the wait: then the expiry
        # has won, and its one outcome is checked below like any other.
        approved = wf.status in WAITING
        if approved:
            expires = wf.pending_approval.expires_at.ToMicroseconds() / 1e6
            # Around the instant: a little before, at, or after (the sweep looks every 50 ms).
            await asyncio.sleep(max(0.0, expires - time.time() + random.uniform(-0.03, 0.06)))
            try:
                await timely.stub.ResumeWorkflow(
                    pb.ResumeWorkflowRequest(
                        task_id=task_id,
                        decision=pb.ApprovalDecision(step_id="deploy", verdict=pb.APPROVE),
                    )
                )
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
                approved = False
        done = await wait_for_status(timely.stub, task_id, timeout=30)
        actors = [actor for actor, _ in decided(done)]
        assert len(actors) == 1, (i, decided(done))
        if approved:
            assert (done.status, actors) == (pb.SUCCEEDED, ["unknown"]), done.error
        else:
            assert (done.status, actors) == (pb.FAILED, ["deadline"]), done.error
        return task_id, approved

    outcomes = await asyncio.gather(*(race(i) for i in range(50)))
    assert len(outcomes) == 50


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"approval_timeout_seconds": 366 * 86400 + 1}, "task.steps[1].approval_timeout_seconds"),
        ({"on_approval_timeout": 9}, "task.steps[1].on_approval_timeout"),
    ],
)
async def test_bad_step_values_are_invalid_argument_naming_the_field(
    running: RunningEngine, tmp_path: Path, change: dict[str, int], field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await running.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=new_task_id(), task=gated(tmp_path / "m", **change))
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(field)


async def test_a_timeout_on_a_step_that_never_waits_and_bad_task_values_are_refused(
    running: RunningEngine,
) -> None:
    cases = [
        (task(step("a", "true", approval_timeout_seconds=5)), "task.steps[0].approval_timeout"),
        (task(step("a", "true", on_approval_timeout=SUSPEND)), "task.steps[0].on_approval_time"),
        (task(step("a", "true"), approval_timeout_seconds=10**9), "task.approval_timeout_seconds"),
        (task(step("a", "true"), on_approval_timeout=7), "task.on_approval_timeout"),
    ]
    for spec, field in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await running.stub.StartWorkflow(
                pb.StartWorkflowRequest(task_id=new_task_id(), task=spec)
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith(field), err.value.details()


async def wake_at_of(db_url: str, task_id: str) -> object:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT wake_at FROM workflow_checkpoints WHERE task_id = %s", (task_id,)
        )
        row = await cur.fetchone()
        assert row is not None
        return row[0]


async def test_only_a_waiting_row_has_a_wake_at(
    running: RunningEngine, db_url: str, tmp_path: Path
) -> None:
    """Written with the checkpoint that begins the wait; cleared by the decision's checkpoint
    and by a cancel (a status write), so a running or finished row never has one."""
    spec = gated(tmp_path / "m", approval_timeout_seconds=3600)
    decided_id, _ = await start_waiting(running, spec)
    cancelled_id, _ = await start_waiting(running, spec)
    assert await wake_at_of(db_url, decided_id) is not None
    await running.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(
            task_id=decided_id,
            decision=pb.ApprovalDecision(step_id="deploy", verdict=pb.APPROVE),
        )
    )
    assert (await wait_for_status(running.stub, decided_id)).status == pb.SUCCEEDED
    assert await wake_at_of(db_url, decided_id) is None
    await running.stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=cancelled_id))
    assert await wake_at_of(db_url, cancelled_id) is None
