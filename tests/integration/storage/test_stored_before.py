"""A checkpoint stored by an earlier version of the engine resumes with this one.

`fixtures/paused_before_issue11.json` holds the rows (checkpoint, lease, task, events) the engine
wrote at commit 9d8bf5d, before the checkpointer stopped talking to the run: a two-step task
paused for approval of its second step. Its LangGraph bookkeeping has no `node_event` channel.
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
from psycopg.types.json import Json

from tests.conftest import RunningEngine
from tests.helpers import wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb

FIXTURE = Path(__file__).parent / "fixtures" / "paused_before_issue11.json"
TABLES = ("task_workflow_leases", "workflow_checkpoints", "workflow_tasks", "workflow_events")


async def test_a_paused_workflow_stored_before_resumes_to_the_end(
    running: RunningEngine, db_url: str
) -> None:
    rows = json.loads(FIXTURE.read_text())
    task_id = rows["workflow_checkpoints"][0]["task_id"]
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        for table in TABLES:
            await conn.execute(
                f"INSERT INTO {table} SELECT * FROM json_populate_recordset(NULL::{table}, %s)",
                (Json(rows[table]),),
            )
    before = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert before.status == pb.WAITING_FOR_APPROVAL
    assert before.pending_approval.step_id == "ship"

    answer = await running.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(
            task_id=task_id, decision=pb.ApprovalDecision(step_id="ship", verdict=pb.APPROVE)
        )
    )
    assert answer.resumed
    done = await wait_for_status(running.stub, task_id)
    assert done.status == pb.SUCCEEDED, done.error
    results = [dict(r) for r in done.state["results"]]
    assert [(r["step_id"], r["stdout"]) for r in results] == [
        ("build", "built\n"),
        ("ship", "shipped\n"),
    ]
    sequences = [e.sequence for e in done.history]
    assert sequences == list(range(1, len(sequences) + 1))  # went on from the stored ones
    assert done.history[8].kind == pb.APPROVAL_DECIDED
