"""A checkpoint row edited to garbage is refused on load; nothing is executed from it."""

from __future__ import annotations

import psycopg

from tests.conftest import RunningEngine
from tests.support.helpers import new_task_id, step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb


async def test_tampered_checkpoint_fails_the_workflow_on_resume(
    running: RunningEngine, db_url: str, tmp_path
) -> None:
    marker = tmp_path / "ran"
    task_id = new_task_id()
    spec = task(step("a", "true"), step("b", "touch", str(marker)))
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    await wait_for_status(running.stub, task_id)
    marker.unlink()
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        # Make it look unfinished, with LangGraph's bookkeeping replaced by a pickle-ish blob.
        # (State and last_node_id stay as the engine wrote them: a change to those is another
        # writer's, which blocks the workflow instead; see tests/integration/orchestrator.)
        await conn.execute(
            "UPDATE workflow_checkpoints SET status = 'RUNNING', checkpoint = to_jsonb(%s::text)"
            " WHERE task_id = %s",
            ("gASVKAAAAAAAAACMBXBvc2l4lIwGc3lzdGVtlJOUjAJpZJSFlFKULg==", task_id),
        )
    resumed = await running.stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=task_id))
    assert resumed.resumed
    wf = await wait_for_status(running.stub, task_id)
    assert wf.status == pb.FAILED
    assert "checkpoint is not a JSON object" in wf.error
    assert not marker.exists()
