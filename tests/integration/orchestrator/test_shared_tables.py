"""The engine inside the orchestrator's own database, with their code acting on the same rows.

Each test runs on the three schemas their ORM and spec give (`tests.support.orchestrator_schema`),
with
their tables created before the engine's migrations, and `their_code` standing for their Go code.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from tests.conftest import RunningEngine
from tests.integration.orchestrator import their_code
from tests.support.helpers import new_task_id, shell_step, step, task, wait_for_status
from tests.support.orchestrator_schema import insert_task
from workflow_engine.v1 import workflow_engine_pb2 as pb

#: Long enough for several recovery sweeps (every 0.2 s in these tests).
SWEEPS = 1.5


async def rows(url: str, task_id: str) -> dict[str, Any]:
    """The task's rows in their tables, every column, as JSON."""
    out: dict[str, Any] = {}
    async with await psycopg.AsyncConnection.connect(url) as conn:
        for table in ("workflow_checkpoints", "task_workflow_leases"):
            cur = await conn.execute(
                f"SELECT to_jsonb(t) FROM {table} t WHERE task_id = %s",  # type: ignore[arg-type]
                (task_id,),
            )
            row = await cur.fetchone()
            out[table] = row[0] if row else None
    return out


async def their_task(url: str, prompt: str = "$ echo hello") -> str:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await insert_task(conn, prompt=prompt)


async def test_start_works_on_their_tables(engine: RunningEngine, direct_url: str) -> None:
    task_id = await their_task(direct_url)
    await engine.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=task(step("a", "echo", "hi")))
    )
    wf = await wait_for_status(engine.stub, task_id)
    assert wf.status == pb.SUCCEEDED, wf.error
    stored = await rows(direct_url, task_id)
    checkpoint, lease = stored["workflow_checkpoints"], stored["task_workflow_leases"]
    assert checkpoint["id"] and checkpoint["updated_at"] and checkpoint["engine_owned"]
    assert checkpoint["last_node_id"] == "finalize_summary"
    assert lease["id"] and lease["created_at"] and lease["updated_at"]
    assert lease["holder_id"] is None  # released at the end


async def test_unknown_task_under_a_foreign_key_is_not_found(
    engine: RunningEngine, direct_url: str, variant: str
) -> None:
    task_id = new_task_id()  # not in their tasks table
    if variant != "fks":  # without their spec's foreign key, an inline task needs no task row
        await engine.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=task(step("a", "true")))
        )
        assert (await wait_for_status(engine.stub, task_id)).status == pb.SUCCEEDED
        return
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await engine.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=task(step("a", "true")))
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert task_id in (err.value.details() or "")
    assert await rows(direct_url, task_id) == {
        "workflow_checkpoints": None,
        "task_workflow_leases": None,
    }


async def test_their_own_workflow_is_never_touched(engine: RunningEngine, direct_url: str) -> None:
    task_id = await their_task(direct_url)
    async with await psycopg.AsyncConnection.connect(direct_url, autocommit=True) as conn:
        await their_code.stub_runner(conn, task_id)
    before = await rows(direct_url, task_id)
    assert before["workflow_checkpoints"]["status"] == ""  # no status of the engine's
    await asyncio.sleep(SWEEPS)  # recovery sweeps run meanwhile
    for call, request in [
        (engine.stub.GetWorkflow, pb.GetWorkflowRequest(task_id=task_id)),
        (engine.stub.ResumeWorkflow, pb.ResumeWorkflowRequest(task_id=task_id)),
        (engine.stub.CancelWorkflow, pb.CancelWorkflowRequest(task_id=task_id)),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(request)  # type: ignore[operator]
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await engine.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=task(step("a", "true")))
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "another writer" in (err.value.details() or "")
    listed = await engine.stub.ListWorkflows(pb.ListWorkflowsRequest())
    assert task_id not in [w.task_id for w in listed.workflows]
    assert await rows(direct_url, task_id) == before


async def test_their_release_mid_run_stops_the_engine_for_good(
    engine: RunningEngine, direct_url: str, tmp_path: Any
) -> None:
    task_id = await their_task(direct_url)
    marker = tmp_path / "second-ran"
    started = await _start_slow_two_steps(engine, direct_url, task_id, marker)
    async with await psycopg.AsyncConnection.connect(direct_url, autocommit=True) as conn:
        await their_code.release(conn, task_id, started.lease_id)
    await asyncio.sleep(1.0 + SWEEPS)  # the step ends; its write and recovery meet the release
    stopped = await rows(direct_url, task_id)
    assert stopped["workflow_checkpoints"]["last_node_id"] == "dispatch_step"  # nothing after
    assert stopped["workflow_checkpoints"]["status"] == "RUNNING"
    assert stopped["task_workflow_leases"]["holder_id"] is None  # not taken back
    assert stopped["task_workflow_leases"]["lease_id"] == started.lease_id
    assert not marker.exists()
    # What callers see: still RUNNING, but stopped, with the reason, in GetWorkflow, its
    # history and ListWorkflows; a running workflow says none of that.
    wf = await engine.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert wf.status == pb.RUNNING and not wf.lease_holder_id
    assert "released by another holder" in wf.stopped_reason
    assert wf.history[-1].kind == pb.STOPPED and wf.history[-1].detail == wf.stopped_reason
    listed = await engine.stub.ListWorkflows(pb.ListWorkflowsRequest())
    assert [w.stopped_reason for w in listed.workflows if w.task_id == task_id] == [
        wf.stopped_reason
    ]
    # An explicit resume is an invitation: the engine carries on from its last checkpoint.
    await engine.stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=task_id))
    running = await engine.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert running.stopped_reason == "" and running.lease_holder_id
    wf = await wait_for_status(engine.stub, task_id)
    assert wf.status == pb.SUCCEEDED, wf.error
    assert wf.stopped_reason == ""
    assert marker.exists()


async def test_their_write_into_an_engine_workflow_is_held_not_resumed(
    engine: RunningEngine, direct_url: str
) -> None:
    task_id = await their_task(direct_url)
    await engine.stub.StartWorkflow(
        pb.StartWorkflowRequest(
            task_id=task_id,
            task=task(step("a", "true"), step("ship", "echo", "shipped", requires_approval=True)),
        )
    )
    await wait_for_status(engine.stub, task_id, {pb.WAITING_FOR_APPROVAL})
    theirs = {"task_id": task_id, "plan": {}, "last_result": {"note": "theirs"}}
    async with await psycopg.AsyncConnection.connect(direct_url, autocommit=True) as conn:
        await their_code.checkpoint(conn, task_id, theirs, "verify_step_result")
    held = await engine.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert "changed outside the engine" in held.blocked_reason
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await engine.stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(
                task_id=task_id,
                decision=pb.ApprovalDecision(step_id="ship", verdict=pb.APPROVE),
            )
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "changed outside the engine" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await engine.stub.UpdateWorkflow(
            pb.UpdateWorkflowRequest(
                task_id=task_id, operator="op", force_branch=pb.FINALIZE_SUMMARY
            )
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await asyncio.sleep(SWEEPS)
    after = await rows(direct_url, task_id)
    assert after["workflow_checkpoints"]["state"] == theirs  # as they wrote it
    assert after["workflow_checkpoints"]["last_node_id"] == "verify_step_result"
    # The operator decides: take their state, re-plan, run.
    await engine.stub.UpdateWorkflow(
        pb.UpdateWorkflowRequest(
            task_id=task_id,
            operator="op",
            reason="theirs is right",
            accept_outside_state=pb.AcceptOutsideState(),
        )
    )
    # Re-planned from the task and run again up to the step that needs approval.
    wf = await wait_for_status(engine.stub, task_id, {pb.WAITING_FOR_APPROVAL, pb.FAILED})
    assert wf.status == pb.WAITING_FOR_APPROVAL, wf.error
    assert wf.blocked_reason == ""
    assert [s["id"] for s in wf.state["plan"]["steps"]] == ["a", "ship"]
    assert wf.pending_approval.step_id == "ship"
    accepted = [e for e in wf.history if e.kind == pb.OVERRIDDEN]
    assert len(accepted) == 1 and accepted[0].actor == "op"
    assert accepted[0].detail.startswith("accepted the state written outside the engine")


async def test_their_write_into_a_running_workflow_stops_it_unwritten(
    engine: RunningEngine, direct_url: str, tmp_path: Any
) -> None:
    task_id = await their_task(direct_url)
    marker = tmp_path / "second-ran"
    await _start_slow_two_steps(engine, direct_url, task_id, marker)
    theirs = {"task_id": task_id, "written": "by them"}
    async with await psycopg.AsyncConnection.connect(direct_url, autocommit=True) as conn:
        await their_code.checkpoint(conn, task_id, theirs, "collect_result")
    wf = await _wait_for_blocked_event(engine, task_id)
    assert "changed outside the engine" in wf.blocked_reason
    stored = await rows(direct_url, task_id)
    assert stored["workflow_checkpoints"]["state"] == theirs
    assert stored["workflow_checkpoints"]["last_node_id"] == "collect_result"
    assert stored["task_workflow_leases"]["holder_id"] is None  # the stopped run let go
    await asyncio.sleep(SWEEPS)
    assert not marker.exists()  # not resumed by recovery either
    # The operator fails it; their state stays as they wrote it.
    failed = await engine.stub.UpdateWorkflow(
        pb.UpdateWorkflowRequest(
            task_id=task_id, operator="op", reason="bad write", force_branch=pb.MARK_FAILED
        )
    )
    assert failed.status == pb.FAILED
    assert "failed by op: bad write" in failed.error
    assert (await rows(direct_url, task_id))["workflow_checkpoints"]["state"] == theirs


async def test_their_acquire_after_the_engine_lease_expired(
    engine: RunningEngine, direct_url: str, tmp_path: Any
) -> None:
    task_id = await their_task(direct_url)
    marker = tmp_path / "second-ran"
    await _start_slow_two_steps(engine, direct_url, task_id, marker)
    async with await psycopg.AsyncConnection.connect(direct_url, autocommit=True) as conn:
        # The engine's lease runs out (its runner stalled), and their acquire takes the task.
        await conn.execute(
            "UPDATE task_workflow_leases SET expires_at = now() - interval '1 second'"
            " WHERE task_id = %s",
            (task_id,),
        )
        acquired = await their_code.acquire(conn, task_id, "their-runner")
        assert acquired.status == "started"
    await asyncio.sleep(1.0 + SWEEPS)  # the engine's run meets the fence; recovery sweeps
    held = await rows(direct_url, task_id)
    assert held["task_workflow_leases"]["holder_id"] == "their-runner"
    assert held["task_workflow_leases"]["lease_id"] == acquired.lease_id
    assert held["workflow_checkpoints"]["last_node_id"] == "dispatch_step"  # the engine stopped
    assert held["workflow_checkpoints"]["stopped_reason"] == (
        "the lease was taken by holder 'their-runner' (not this engine)"
    )
    async with await psycopg.AsyncConnection.connect(direct_url, autocommit=True) as conn:
        again = await their_code.acquire(conn, task_id, "their-runner", acquired.lease_id)
        assert again.status == "already_running"  # their idempotent answer still holds
        await their_code.release(conn, task_id, acquired.lease_id)
    await asyncio.sleep(SWEEPS)  # released by them: a stop, not an orphan
    released = await rows(direct_url, task_id)
    assert released["task_workflow_leases"]["holder_id"] is None
    assert released["workflow_checkpoints"]["last_node_id"] == "dispatch_step"
    async with await psycopg.AsyncConnection.connect(direct_url, autocommit=True) as conn:
        # Their runner takes it again and dies: their lease expires. Still theirs, not an orphan.
        await their_code.acquire(conn, task_id, "their-runner")
        await conn.execute(
            "UPDATE task_workflow_leases SET expires_at = now() - interval '1 second'"
            " WHERE task_id = %s",
            (task_id,),
        )
    await asyncio.sleep(SWEEPS)
    expired = await rows(direct_url, task_id)
    assert expired["task_workflow_leases"]["holder_id"] == "their-runner"
    assert expired["workflow_checkpoints"]["last_node_id"] == "dispatch_step"
    assert not marker.exists()


async def _start_slow_two_steps(
    engine: RunningEngine, url: str, task_id: str, marker: Path
) -> pb.StartWorkflowResponse:
    """Start a 1 s step followed by one that touches `marker`; return once the first is
    dispatched (its checkpoint written)."""
    started = await engine.stub.StartWorkflow(
        pb.StartWorkflowRequest(
            task_id=task_id,
            task=task(shell_step("slow", "sleep 1"), step("after", "touch", str(marker))),
        )
    )
    await _wait_for_node(url, task_id, "dispatch_step")
    return started


async def _wait_for_node(url: str, task_id: str, node: str, timeout: float = 20) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for _ in range(int(timeout / 0.02)):
            cur = await conn.execute(
                "SELECT last_node_id FROM workflow_checkpoints WHERE task_id = %s", (task_id,)
            )
            row = await cur.fetchone()
            if row and row[0] == node:
                return
            await asyncio.sleep(0.02)
    raise TimeoutError(f"{task_id} never reached {node}")


async def _wait_for_blocked_event(
    engine: RunningEngine, task_id: str, timeout: float = 20
) -> pb.Workflow:
    for _ in range(int(timeout / 0.05)):
        wf = await engine.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
        if any(e.kind == pb.BLOCKED for e in wf.history) and not wf.lease_holder_id:
            return wf
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{task_id} was never blocked")
