"""Callers scoped to projects or users see, list, watch and change only their own workflows,
and cannot tell that another tenant's exist."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.helpers import new_task_id, snapshot, step, task, wait_for_status, write_secret
from workflow_engine.config import Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb

CALLERS = {
    "root": {"role": "orchestrator"},
    "a-orchestrator": {"role": "orchestrator", "projects": ["project-a"]},
    "a-operator": {"role": "operator", "projects": ["project-a"]},
    "b-operator": {"role": "operator", "projects": ["project-b"]},
    "bob-in-a": {"role": "reader", "projects": ["project-a"], "users": ["bob"]},
}


def md(name: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer token-of-{name}-0123456789")]


@pytest.fixture
async def tenants(settings: Settings, tmp_path: Path) -> AsyncIterator[RunningEngine]:
    path = tmp_path / "tokens.json"
    callers = [
        {"identity": name, "token": md(name)[0][1].removeprefix("Bearer "), **fields}
        for name, fields in CALLERS.items()
    ]
    write_secret(path, json.dumps({"callers": callers}))
    running = await start_engine(replace(settings, tokens_file=str(path)))
    try:
        yield running
    finally:
        await stop_engine(running)


async def start(
    running: RunningEngine, project: str, user: str, *steps: pb.Step, who: str = "root"
) -> str:
    task_id = new_task_id()
    spec = task(*(steps or (step("s", "sleep", "30"),)))
    spec.metadata.project_id, spec.metadata.user_id = project, user
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=spec), metadata=md(who)
    )
    return task_id


async def dispatched(running: RunningEngine, *task_ids: str) -> None:
    """Wait until each workflow waits on its 30 s job: its row stays as it is meanwhile."""
    for task_id in task_ids:
        for _ in range(200):
            wf = await running.stub.GetWorkflow(
                pb.GetWorkflowRequest(task_id=task_id), metadata=md("root")
            )
            if wf.last_node_id == "dispatch_step":
                break
            await asyncio.sleep(0.05)
        else:
            raise TimeoutError(f"{task_id} never dispatched its step")


async def refusal(call: Any) -> tuple[grpc.StatusCode, str]:
    try:
        result = await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), (exc.details() or "")
    raise AssertionError(f"not refused: {result}")


async def first_event(running: RunningEngine, task_id: str, who: str) -> Any:
    call = running.stub.WatchWorkflow(pb.WatchWorkflowRequest(task_id=task_id), metadata=md(who))
    async for event in call:
        return event


async def test_another_tenants_workflow_is_not_found_and_unchanged(
    tenants: RunningEngine, db_url: str
) -> None:
    theirs = await start(tenants, "project-b", "carol")
    unknown = new_task_id()
    await dispatched(tenants, theirs)
    before = await snapshot(db_url)
    stub = tenants.stub
    decision = pb.ApprovalDecision(step_id="s", verdict=pb.APPROVE)
    for target in (theirs, unknown):
        answers = [
            await refusal(
                stub.GetWorkflow(pb.GetWorkflowRequest(task_id=target), metadata=md("a-operator"))
            ),
            await refusal(first_event(tenants, target, "a-operator")),
            await refusal(
                stub.CancelWorkflow(
                    pb.CancelWorkflowRequest(task_id=target), metadata=md("a-operator")
                )
            ),
            await refusal(
                stub.ResumeWorkflow(
                    pb.ResumeWorkflowRequest(task_id=target, decision=decision),
                    metadata=md("a-operator"),
                )
            ),
            await refusal(
                stub.UpdateWorkflow(
                    pb.UpdateWorkflowRequest(
                        task_id=target, operator="x", force_branch=pb.Branch.MARK_FAILED
                    ),
                    metadata=md("a-operator"),
                )
            ),
            await refusal(
                stub.ResumeWorkflow(
                    pb.ResumeWorkflowRequest(task_id=target), metadata=md("a-orchestrator")
                )
            ),
        ]
        # The same code and the same words as for a task that has no workflow at all.
        assert {(code, text.replace(target, "<id>")) for code, text in answers} == {
            (grpc.StatusCode.NOT_FOUND, "task_id: no workflow for task <id>")
        }
    assert await snapshot(db_url) == before
    wf = await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=theirs), metadata=md("b-operator"))
    assert wf.status == pb.RUNNING  # its own tenant sees it, and it still runs


async def test_a_tenant_lists_only_its_own_and_starts_only_in_its_projects(
    tenants: RunningEngine, db_url: str
) -> None:
    ours = await start(tenants, "project-a", "bob")
    alices = await start(tenants, "project-a", "alice")
    theirs = await start(tenants, "project-b", "bob")

    async def listed(who: str) -> set[str]:
        page = await tenants.stub.ListWorkflows(pb.ListWorkflowsRequest(), metadata=md(who))
        return {w.task_id for w in page.workflows}

    assert await listed("root") == {ours, alices, theirs}
    assert await listed("a-operator") == {ours, alices}
    assert await listed("b-operator") == {theirs}
    assert await listed("bob-in-a") == {ours}  # scoped to a project and a user: both must match
    assert (await first_event(tenants, ours, "bob-in-a")).status == pb.RUNNING

    await dispatched(tenants, ours, alices, theirs)
    before = await snapshot(db_url)
    code, text = await refusal(
        tenants.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=new_task_id(), task=_in("project-b")),
            metadata=md("a-orchestrator"),
        )
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED and "project-b" in text
    # Another tenant's task id: taken, and that is all it says (no status, no lease holder).
    code, text = await refusal(
        tenants.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=theirs, task=_in("project-a")),
            metadata=md("a-orchestrator"),
        )
    )
    assert code == grpc.StatusCode.ALREADY_EXISTS
    assert "not shown" in text and "RUNNING" not in text and "test-engine" not in text
    assert await snapshot(db_url) == before  # nothing stored for the refused starts
    mine = new_task_id()
    await tenants.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=mine, task=_in("project-a", "true")),
        metadata=md("a-orchestrator"),
    )
    done = await wait_for_status(tenants.stub, mine, metadata=md("a-operator"))
    assert done.status == pb.SUCCEEDED


def _in(project: str, *command: str) -> pb.TaskSpec:
    spec = task(step("s", *(command or ("true",))))
    spec.metadata.project_id = project
    return spec
