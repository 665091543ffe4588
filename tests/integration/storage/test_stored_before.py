"""A checkpoint stored by an earlier version of the engine resumes with this one.

`fixtures/paused_before_issue11.json` holds the rows (checkpoint, lease, task, events) the engine
wrote at commit 9d8bf5d, before the checkpointer stopped talking to the run: a two-step task
paused for approval of its second step. Its LangGraph bookkeeping has no `node_event` channel,
and its rows have none of the columns later migrations add (ownership, digest, handover): they
are loaded into a schema of that version, and the engine's start migrates them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Json

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support import database
from tests.support.helpers import new_task_id, step, task, wait_for_status
from workflow_engine.config import Settings
from workflow_engine.storage import migrate
from workflow_engine.v1 import workflow_engine_pb2 as pb

FIXTURE = Path(__file__).parent / "fixtures" / "paused_before_issue11.json"
TABLES = ("task_workflow_leases", "workflow_checkpoints", "workflow_tasks", "workflow_events")


#: The schema version the fixture's rows were written at (migrations 0 to 2).
FIXTURE_SCHEMA = 3


@pytest.fixture
async def running(pg_server_url: str, settings: Settings) -> AsyncIterator[RunningEngine]:
    """An engine started on a database that held the fixture's rows at the schema they were
    written with; starting it applies the later migrations to them, as an upgrade would."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {name}")
    url = make_conninfo(pg_server_url, dbname=name)
    rows = json.loads(FIXTURE.read_text())
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await migrate(conn, up_to=FIXTURE_SCHEMA)
        for table in TABLES:
            await conn.execute(
                f"INSERT INTO {table} SELECT * FROM json_populate_recordset(NULL::{table}, %s)",
                (Json(rows[table]),),
            )
    assert database.ROUTE is not None
    replica = await start_engine(replace(settings, database_url=database.ROUTE.client(name)))
    try:
        yield replica
    finally:
        await stop_engine(replica)
        async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def test_a_paused_workflow_stored_before_resumes_to_the_end(running: RunningEngine) -> None:
    rows = json.loads(FIXTURE.read_text())
    task_id = rows["workflow_checkpoints"][0]["task_id"]
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


async def test_a_workflow_drained_before_the_upgrade_is_adopted_after_it(
    settings: Settings, db_url: str
) -> None:
    """A RUNNING workflow whose lease a draining replica released before migration 3 (ownership,
    handover) is still an orphan after it: the upgrade marks that release as a handover."""
    draining = await start_engine(settings)
    task_id = new_task_id()
    await draining.stub.StartWorkflow(
        pb.StartWorkflowRequest(
            task_id=task_id, task=task(step("slow", "sleep", "0.5"), step("b", "true"))
        )
    )
    await stop_engine(draining)  # stops at a node boundary and releases the lease
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        # Make the rows what the version before migration 3 wrote, and that migration pending.
        await conn.execute("UPDATE workflow_checkpoints SET engine_owned = false")
        await conn.execute(
            "UPDATE task_workflow_leases SET engine_lease_id = NULL, handed_over = false"
        )
        await conn.execute("DELETE FROM workflow_engine_migrations WHERE version >= 3")
    survivor = await start_engine(
        settings.with_overrides(holder_id="survivor", recovery_interval_seconds=0.2)
    )
    try:
        wf = await wait_for_status(survivor.stub, task_id, timeout=20)
        assert wf.status == pb.SUCCEEDED, wf.error
    finally:
        await stop_engine(survivor)
