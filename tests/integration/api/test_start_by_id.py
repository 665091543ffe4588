"""StartWorkflow without a task: the task is loaded by id from the orchestrator's `tasks` table.

Each test runs a real engine over gRPC on a database holding the orchestrator's `tasks` table
as their ORM makes it (`orchestrator_url`, from `tests.support.orchestrator_schema`), with task rows
inserted as their ORM inserts them. The resume after a crash is in `tests/e2e`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf import json_format

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support import database
from tests.support.helpers import new_task_id, snapshot, step, stored_task, task, wait_for_status
from tests.support.orchestrator_schema import insert_task_at
from workflow_engine.config import Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb

USER = "11111111-1111-4111-8111-111111111111"
PROJECT = "22222222-2222-4222-8222-222222222222"


def on(url: str, settings: Settings, **overrides: Any) -> Settings:
    """The test engine's settings, on the orchestrator's database."""
    return replace(settings, database_url=url, **database.engine_settings(url), **overrides)  # type: ignore[arg-type]


@pytest.fixture
async def engine(orchestrator_url: str, settings: Settings) -> AsyncIterator[RunningEngine]:
    """An engine with the default task source (`inline`) on the orchestrator's database."""
    replica = await start_engine(on(orchestrator_url, settings))
    try:
        yield replica
    finally:
        await stop_engine(replica)


async def execute(url: str, sql: str, *params: Any) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(sql, params)


def state_of(workflow: pb.Workflow) -> dict[str, Any]:
    return json_format.MessageToDict(workflow.state)


async def refused(
    call: Any, code: grpc.StatusCode, *, url: str, contains: str = ""
) -> grpc.aio.AioRpcError:
    """`call` fails with `code`, and the engine's tables are as they were."""
    before = await snapshot(url)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == code, err.value.details()
    assert contains in (err.value.details() or ""), err.value.details()
    assert await snapshot(url) == before  # no workflow row, no lease, no stored task
    return err.value


async def test_a_task_started_by_id_runs_from_the_orchestrators_row(
    engine: RunningEngine, orchestrator_url: str
) -> None:
    """The default source falls back to the tasks table; its `$ ` prompt line is the step."""
    task_id = await insert_task_at(
        orchestrator_url,
        prompt="Say hello\n$ echo hello",
        acceptance_criteria=["greets", {"description": "says hello", "check": None}],
        summary="Greeting",
        metadata={"team": "core", "priority": 3},
        created_by=USER,
        project_id=PROJECT,
    )
    started = await engine.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id))
    assert started.status == pb.STARTED

    done = await wait_for_status(engine.stub, task_id)
    assert done.status == pb.SUCCEEDED, done.error
    state = state_of(done)
    assert state["prompt"] == "Say hello\n$ echo hello"
    assert [r["stdout"] for r in state["results"]] == ["hello\n"]
    assert [c["description"] for c in state["acceptance_criteria"]] == ["greets", "says hello"]
    assert state["metadata"] == {
        "user_id": USER,
        "project_id": PROJECT,
        "labels": {"team": "core", "name": "Greeting"},
    }
    spec = await stored_task(orchestrator_url, task_id)
    assert spec.prompt == "Say hello\n$ echo hello"
    assert spec.metadata.user_id == USER


async def test_an_unknown_task_is_not_found(engine: RunningEngine, orchestrator_url: str) -> None:
    task_id = new_task_id()
    await refused(
        engine.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id)),
        grpc.StatusCode.NOT_FOUND,
        url=orchestrator_url,
        contains=f"task {task_id} not found in the orchestrator's tasks table",
    )


async def test_a_closed_task_is_not_startable(engine: RunningEngine, orchestrator_url: str) -> None:
    task_id = await insert_task_at(orchestrator_url, closed=True)
    await refused(
        engine.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id)),
        grpc.StatusCode.FAILED_PRECONDITION,
        url=orchestrator_url,
        contains="it is closed",
    )


@pytest.mark.parametrize("orchestrator_url", ["soft_delete"], indirect=True)
async def test_a_soft_deleted_task_is_not_startable(
    engine: RunningEngine, orchestrator_url: str
) -> None:
    task_id = await insert_task_at(orchestrator_url)
    await execute(orchestrator_url, "UPDATE tasks SET deleted_at = now() WHERE id = %s", task_id)
    await refused(
        engine.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id)),
        grpc.StatusCode.FAILED_PRECONDITION,
        url=orchestrator_url,
        contains="it was deleted",
    )


async def test_an_inline_task_wins_over_the_tasks_table(
    orchestrator_url: str, settings: Settings
) -> None:
    """Whatever the source, here `orchestrator` itself: the task sent is the one that runs."""
    replica = await start_engine(on(orchestrator_url, settings, task_source="orchestrator"))
    try:
        task_id = await insert_task_at(orchestrator_url, prompt="$ echo from-the-table")
        inline = task(step("s", "echo", "sent-inline"), prompt="inline")
        await replica.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=inline))
        done = await wait_for_status(replica.stub, task_id)
        assert done.status == pb.SUCCEEDED, done.error
        assert [r["stdout"] for r in state_of(done)["results"]] == ["sent-inline\n"]
        assert (await stored_task(orchestrator_url, task_id)).prompt == "inline"
    finally:
        await stop_engine(replica)


async def test_without_a_tasks_table_a_task_is_required(
    running: RunningEngine, db_url: str
) -> None:
    """The engine's own database (no orchestrator tables) and the default source."""
    await refused(
        running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=new_task_id())),
        grpc.StatusCode.INVALID_ARGUMENT,
        url=db_url,
        contains="task: required (no task source is configured",
    )


async def test_the_orchestrator_source_without_a_tasks_table_is_unavailable(
    db_url: str, settings: Settings
) -> None:
    replica = await start_engine(replace(settings, task_source="orchestrator"))
    try:
        await refused(
            replica.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=new_task_id())),
            grpc.StatusCode.UNAVAILABLE,
            url=db_url,
            contains="the database has no such table",
        )
    finally:
        await stop_engine(replica)


async def test_a_repeated_start_is_answered_as_before_once_the_task_is_closed(
    engine: RunningEngine, orchestrator_url: str
) -> None:
    """The orchestrator closes a task when its workflow is done; a retried start still gets
    the truth (ALREADY_FINISHED), not a refusal of the task."""
    task_id = await insert_task_at(orchestrator_url)
    key = new_task_id()
    request = pb.StartWorkflowRequest(task_id=task_id, idempotency_key=key)
    first = await engine.stub.StartWorkflow(request)
    assert (await wait_for_status(engine.stub, task_id)).status == pb.SUCCEEDED
    await execute(orchestrator_url, "UPDATE tasks SET closed = true WHERE id = %s", task_id)

    again = await engine.stub.StartWorkflow(request)
    assert (again.status, again.run_id) == (pb.ALREADY_FINISHED, first.run_id)
    await refused(
        engine.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id)),
        grpc.StatusCode.ALREADY_EXISTS,
        url=orchestrator_url,
    )
