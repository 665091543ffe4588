"""Budgets suspend a workflow; operators override one between nodes, recorded in its history."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from tests.conftest import RunningEngine
from tests.support.helpers import new_task_id, shell_step, step, struct, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb


def state_of(wf: pb.Workflow) -> dict[str, object]:
    return json_format.MessageToDict(wf.state)


def counting_step(step_id: str, counter: Path, passes_at: int) -> pb.Step:
    """Fails until it has run `passes_at` times."""
    return shell_step(
        step_id,
        f"n=$(cat {counter} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {counter}; "
        f"[ $n -ge {passes_at} ]",
    )


async def test_a_low_dispatch_cap_suspends_with_a_summary_and_a_raised_budget_continues(
    running: RunningEngine, tmp_path: Path
) -> None:
    counter = tmp_path / "count"
    task_id = new_task_id()
    spec = task(
        step("setup", "echo", "ok"),
        counting_step("flaky", counter, passes_at=5),
        max_attempts_per_step=50,
        budget=pb.Budget(max_dispatches=3),
    )
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    wf = await wait_for_status(running.stub, task_id, {pb.SUSPENDED, *TERMINAL_ALL})
    assert wf.status == pb.SUSPENDED, wf.error
    assert counter.read_text().strip() == "2"  # setup + two attempts at flaky = 3 dispatches
    assert "budget of 3 dispatch(es) is used up" in wf.summary
    assert "Done (1): setup" in wf.summary
    assert "remaining: flaky" in wf.summary

    # Resuming without a raised budget is refused; with one it goes on from where it stopped.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await running.stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=task_id))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (err.value.details() or "").startswith("budget: required")
    await running.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(task_id=task_id, budget=pb.Budget(max_dispatches=10))
    )
    done = await wait_for_status(running.stub, task_id)
    assert done.status == pb.SUCCEEDED, done.error
    assert counter.read_text().strip() == "5"
    final = state_of(done)
    assert final["attempts_by_step"] == {"setup": 1, "flaky": 5}
    assert final["dispatches"] == 6
    assert final["budget"]["max_dispatches"] == 10  # type: ignore[index]


async def test_consecutive_attempts_budget_suspends(running: RunningEngine, tmp_path: Path) -> None:
    task_id = new_task_id()
    spec = task(
        step("never", "false"),
        max_attempts_per_step=50,
        budget=pb.Budget(max_consecutive_attempts=2),
    )
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    wf = await wait_for_status(running.stub, task_id, {pb.SUSPENDED, *TERMINAL_ALL})
    assert wf.status == pb.SUSPENDED
    assert "step never reached the budget of 2 consecutive attempt(s)" in wf.summary


TERMINAL_ALL = {pb.SUCCEEDED, pb.FAILED, pb.CANCELLED}


def override(task_id: str, **kw: object) -> pb.UpdateWorkflowRequest:
    return pb.UpdateWorkflowRequest(task_id=task_id, **kw)


async def test_force_mark_failed_on_a_running_workflow_between_nodes(
    running: RunningEngine, tmp_path: Path
) -> None:
    second = tmp_path / "second-ran"
    task_id = new_task_id()
    spec = task(step("long", "sleep", "1"), shell_step("next", f"touch {second}"))
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    for _ in range(200):  # until the long step's job is dispatched: the override lands after it
        wf = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
        if state_of(wf).get("dispatches") == 1:
            break
        await asyncio.sleep(0.02)
    updated = await running.stub.UpdateWorkflow(
        override(task_id, operator="bob", reason="wrong branch", force_branch=pb.MARK_FAILED)
    )
    assert updated.status == pb.FAILED  # what it is committed to, even before mark_failed ran
    done = await wait_for_status(running.stub, task_id)
    assert done.status == pb.FAILED
    assert done.error == "failed by bob: wrong branch"
    assert not second.exists()  # the forced branch replaced the rest of the plan
    overrides = [e for e in done.history if e.kind == pb.OVERRIDDEN]
    assert [(e.actor, e.detail) for e in overrides] == [("bob", "forced mark_failed: wrong branch")]
    # Applied at once: the running collect_result was abandoned, nothing was verified after.
    nodes = [e.node_id for e in done.history if e.kind == pb.NODE_COMPLETED]
    assert nodes[-1] == "mark_failed"
    assert "verify_step_result" not in nodes[nodes.index("dispatch_step") :]


async def test_reject_last_result_causes_exactly_one_more_attempt(
    running: RunningEngine, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    task_id = new_task_id()
    spec = task(
        shell_step("build", f"echo built >> {runs}"),
        step("ship", "echo", "shipped", requires_approval=True),
    )
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    await wait_for_status(running.stub, task_id, {pb.WAITING_FOR_APPROVAL})
    assert runs.read_text() == "built\n"

    await running.stub.UpdateWorkflow(
        override(
            task_id, operator="carol", reason="bad build", reject_last_result=pb.RejectLastResult()
        )
    )
    again = await wait_for_status(running.stub, task_id, {pb.WAITING_FOR_APPROVAL, *TERMINAL_ALL})
    assert again.status == pb.WAITING_FOR_APPROVAL
    assert runs.read_text() == "built\nbuilt\n"  # one more attempt, no more
    assert state_of(again)["attempts_by_step"] == {"build": 2}
    await running.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(
            task_id=task_id, decision=pb.ApprovalDecision(step_id="ship", verdict=pb.APPROVE)
        )
    )
    done = await wait_for_status(running.stub, task_id)
    assert done.status == pb.SUCCEEDED, done.error
    assert runs.read_text() == "built\nbuilt\n"
    assert state_of(done)["attempts_by_step"] == {"build": 2, "ship": 1}
    overrides = [(e.actor, e.detail) for e in done.history if e.kind == pb.OVERRIDDEN]
    assert overrides == [("carol", "rejected the last result of step build: bad build")]


async def test_set_state_edits_fields_and_refuses_the_rest(
    running: RunningEngine, tmp_path: Path
) -> None:
    task_id = new_task_id()
    spec = task(step("a", "echo", "a"), step("b", "echo", "b", requires_approval=True))
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    before = await wait_for_status(running.stub, task_id, {pb.WAITING_FOR_APPROVAL})

    for patch, field in [
        ({"task_id": "x"}, "set_state.task_id"),
        ({"status": "succeeded"}, "set_state.status"),
        ({"nonsense": 1}, "set_state.nonsense"),
        ({"max_attempts_per_step": "three"}, "set_state.max_attempts_per_step"),
        ({"plan": {"steps": []}}, "set_state.plan.steps"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await running.stub.UpdateWorkflow(
                override(task_id, operator="dave", set_state=struct(patch))
            )
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, patch
        assert (err.value.details() or "").startswith(field), err.value.details()
    for bad, field in [
        (override(task_id, set_state=struct({"summary": "x"})), "operator"),
        (override(task_id, operator="dave"), "action"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await running.stub.UpdateWorkflow(bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith(field)
    unchanged = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert unchanged.updated_at == before.updated_at and unchanged.state == before.state

    await running.stub.UpdateWorkflow(
        override(task_id, operator="dave", set_state=struct({"max_attempts_per_step": 7}))
    )
    edited = await wait_for_status(running.stub, task_id, {pb.WAITING_FOR_APPROVAL})
    assert state_of(edited)["max_attempts_per_step"] == 7


async def test_overrides_on_a_finished_workflow_are_refused(running: RunningEngine) -> None:
    task_id = new_task_id()
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=task(step("a", "true")))
    )
    await wait_for_status(running.stub, task_id)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await running.stub.UpdateWorkflow(
            override(task_id, operator="erin", force_branch=pb.FINALIZE_SUMMARY)
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
