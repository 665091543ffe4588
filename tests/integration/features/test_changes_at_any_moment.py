"""A decision, a raised budget or an override is applied exactly once whenever it arrives, or
refused with the reason; never answered OK and dropped. The answer states the status the
workflow has, or is committed to, after the call.

The sharpest moment is the instant a pause is observed: the run that wrote it has not ended yet.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

from tests.conftest import RunningEngine
from tests.integration.features.test_cancel import wait_for_file, wait_gone
from tests.support.helpers import (
    job_pids,
    new_task_id,
    shell_step,
    step,
    task,
    unique_sleep,
    wait_for_status,
)
from workflow_engine.v1 import workflow_engine_pb2 as pb

ROUNDS = 50
AT_ONCE = 10


def gated() -> pb.TaskSpec:
    return task(step("prepare", "true"), step("deploy", "true", requires_approval=True))


async def start_and_catch_the_pause(running: RunningEngine) -> str:
    """Start `gated` and return the moment the watch stream says WAITING_FOR_APPROVAL."""
    task_id = new_task_id()
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=gated()))
    async for event in running.stub.WatchWorkflow(pb.WatchWorkflowRequest(task_id=task_id)):
        if event.kind == pb.STATUS_CHANGED and event.status == pb.WAITING_FOR_APPROVAL:
            return task_id
    raise AssertionError("the watch ended without a pause")


async def in_rounds(check: object) -> None:
    for first in range(0, ROUNDS, AT_ONCE):
        await asyncio.gather(*(check() for _ in range(first, first + AT_ONCE)))  # type: ignore[operator]


async def test_a_decision_sent_the_instant_the_pause_is_seen_is_applied_once(
    running: RunningEngine,
) -> None:
    async def one() -> None:
        task_id = await start_and_catch_the_pause(running)
        answer = await running.stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(
                task_id=task_id,
                decision=pb.ApprovalDecision(step_id="deploy", verdict=pb.APPROVE),
            )
        )
        assert answer.resumed
        assert answer.status in (pb.RUNNING, pb.SUCCEEDED), pb.WorkflowStatus.Name(answer.status)
        done = await wait_for_status(running.stub, task_id)
        assert done.status == pb.SUCCEEDED, done.error
        decided = [e for e in done.history if e.kind == pb.APPROVAL_DECIDED]
        assert len(decided) == 1

    await in_rounds(one)


async def test_an_override_sent_the_instant_the_pause_is_seen_is_applied_once(
    running: RunningEngine,
) -> None:
    async def one() -> None:
        task_id = await start_and_catch_the_pause(running)
        answer = await running.stub.UpdateWorkflow(
            pb.UpdateWorkflowRequest(
                task_id=task_id, operator="op", reason="stop here", force_branch=pb.MARK_FAILED
            )
        )
        assert answer.status == pb.FAILED  # committed to, even before mark_failed has run
        done = await wait_for_status(running.stub, task_id)
        assert done.status == pb.FAILED
        assert done.error == "failed by op: stop here"
        assert len([e for e in done.history if e.kind == pb.OVERRIDDEN]) == 1

    await in_rounds(one)


@pytest.mark.parametrize(
    ("decision", "status"),
    [
        (pb.ApprovalDecision(step_id="deploy", verdict=pb.REJECT, reason="no"), pb.FAILED),
        (pb.ApprovalDecision(step_id="deploy", verdict=pb.APPROVE), pb.RUNNING),
    ],
)
async def test_a_decisions_answer_says_where_the_workflow_is_bound(
    running: RunningEngine, decision: pb.ApprovalDecision, status: int
) -> None:
    task_id = new_task_id()
    spec = task(step("prepare", "true"), step("deploy", "sleep", "1", requires_approval=True))
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    await wait_for_status(running.stub, task_id, {pb.WAITING_FOR_APPROVAL})
    answer = await running.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(task_id=task_id, decision=decision)
    )
    assert answer.resumed and answer.status == status, pb.WorkflowStatus.Name(answer.status)
    assert "pending_approval" not in answer.state or not answer.state["pending_approval"]


async def test_a_budget_raised_while_the_workflow_runs_here_is_applied_once(
    running: RunningEngine,
) -> None:
    task_id = new_task_id()
    spec = task(
        step("slow", "sleep", "1.5"), step("after", "true"), budget=pb.Budget(max_dispatches=5)
    )
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    await wait_for_status(running.stub, task_id, {pb.RUNNING})
    answer = await running.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(task_id=task_id, budget=pb.Budget(max_dispatches=9))
    )
    assert answer.resumed and answer.status == pb.RUNNING
    assert answer.state["budget"]["max_dispatches"] == 9
    done = await wait_for_status(running.stub, task_id)
    assert done.status == pb.SUCCEEDED, done.error
    assert done.state["budget"]["max_dispatches"] == 9
    budget_events = [e for e in done.history if e.detail.startswith("budget:")]
    assert len(budget_events) == 1


async def test_a_pause_is_visible_only_with_its_lease_released_so_any_replica_can_decide(
    running: RunningEngine, second_replica: RunningEngine, db_url: str
) -> None:
    """The write that pauses the workflow also releases its lease: a decision sent to another
    replica the instant the pause is seen is taken there, not refused as "leased"."""

    async def one() -> None:
        task_id = await start_and_catch_the_pause(running)
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            cur = await conn.execute(
                "SELECT holder_id FROM task_workflow_leases WHERE task_id = %s", (task_id,)
            )
            assert await cur.fetchone() == (None,)
        answer = await second_replica.stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(
                task_id=task_id,
                decision=pb.ApprovalDecision(step_id="deploy", verdict=pb.APPROVE),
            )
        )
        assert answer.resumed
        done = await wait_for_status(second_replica.stub, task_id)
        assert done.status == pb.SUCCEEDED, done.error
        assert len([e for e in done.history if e.kind == pb.APPROVAL_DECIDED]) == 1

    await asyncio.gather(*(one() for _ in range(AT_ONCE)))


async def test_an_override_does_not_wait_for_the_running_job_and_ends_it_with_the_workflow(
    running: RunningEngine, tmp_path: Path
) -> None:
    """The run abandons collect_result (the job would run ten minutes), applies the override at
    once, and when the forced branch ends the workflow its job is stopped too."""
    pid_file = tmp_path / "pid"
    sleeper = unique_sleep(600)
    task_id = new_task_id()
    spec = task(shell_step("long", f"echo $$ > {pid_file}; exec sleep {sleeper}"))
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    await wait_for_file(pid_file)
    pids = job_pids(sleeper)
    answer = await running.stub.UpdateWorkflow(
        pb.UpdateWorkflowRequest(task_id=task_id, operator="op", force_branch=pb.MARK_FAILED),
        timeout=5,
    )
    assert answer.status == pb.FAILED
    await wait_gone(pids)
    done = await wait_for_status(running.stub, task_id)
    assert done.status == pb.FAILED
