"""StartWorkflow by task id as another tenant meets it (issue 48, finding 15).

The attacker is a tenant: a caller scoped to its own projects, which chooses the task ids it
sends. It sends the ids of tasks the orchestrator holds for another tenant, read from the
orchestrator's ``tasks`` table (the ``orchestrator`` source, and ``inline`` falling back to
it) or from its MCP server. Whatever that task is (open, closed, finished, gone from the table
with its workflow left), the answer is the one an id that exists nowhere gets: the same code,
the same words but for the id. It never names the other tenant's project or user (it quoted
both), and nothing is stored.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, LiteralString

import grpc
import psycopg
import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.integration.capabilities.test_mcp_tasks import (
    TOKEN,
    Served,
    orchestrator_mcp,
    requiring_token,
    serve,
)
from tests.support import database
from tests.support.helpers import new_task_id, snapshot, wait_for_status, write_secret
from tests.support.orchestrator_schema import insert_task_at
from workflow_engine.config import McpSettings, Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb

# The orchestrator's ids are UUIDs (its `tasks` columns are uuid).
PROJECT_A = "aaaaaaaa-0000-4000-8000-00000000000a"
USER_A = "aaaaaaaa-0000-4000-8000-0000000000a1"
PROJECT_B = "bbbbbbbb-0000-4000-8000-00000000000b"
CALLERS = {
    "a-orchestrator": {"role": "orchestrator", "projects": [PROJECT_A]},
    "b-orchestrator": {"role": "orchestrator", "projects": [PROJECT_B]},
}


def md(name: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer token-of-{name}-0123456789abcdef")]


def on_orchestrator_db(settings: Settings, tmp_path: Path, url: str, **overrides: Any) -> Settings:
    """The test's settings on the orchestrator's database, with the callers of `CALLERS`."""
    callers = [
        {"identity": name, "token": md(name)[0][1].removeprefix("Bearer "), **fields}
        for name, fields in CALLERS.items()
    ]
    tokens = write_secret(tmp_path / "tokens.json", json.dumps({"callers": callers}))
    return replace(
        settings,
        database_url=url,
        **database.engine_settings(url),  # type: ignore[arg-type]
        tokens_file=str(tokens),
        **overrides,
    )


@pytest.fixture(params=["orchestrator", "inline"])
async def engine(
    request: pytest.FixtureRequest, settings: Settings, tmp_path: Path, orchestrator_url: str
) -> AsyncIterator[RunningEngine]:
    """An engine loading tasks by id from the orchestrator's `tasks` table."""
    chosen = on_orchestrator_db(settings, tmp_path, orchestrator_url, task_source=request.param)
    running = await start_engine(chosen)
    try:
        yield running
    finally:
        await stop_engine(running)


async def refusal(running: RunningEngine, task_id: str, caller: str) -> tuple[Any, str]:
    """The code and message StartWorkflow of `task_id` (no task sent) answers `caller`."""
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await running.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id), metadata=md(caller)
        )
    return refused.value.code(), refused.value.details() or ""


async def answers_as_if_missing(running: RunningEngine, url: str, task_id: str) -> None:
    """Tenant B, sending tenant A's `task_id`, gets what an id that exists nowhere gets; the
    answer names neither A's project nor its user, and nothing is stored."""
    before = await snapshot(url)
    code, said = await refusal(running, task_id, "b-orchestrator")
    missing = new_task_id()
    assert (code, said.replace(task_id, missing)) == await refusal(
        running, missing, "b-orchestrator"
    )
    assert code == grpc.StatusCode.NOT_FOUND, said
    assert PROJECT_A not in said and USER_A not in said, said
    assert await snapshot(url) == before


async def test_another_tenants_task_answers_as_one_that_does_not_exist(
    engine: RunningEngine, orchestrator_url: str
) -> None:
    task_id = await insert_task_at(
        orchestrator_url, prompt="$ true", created_by=USER_A, project_id=PROJECT_A
    )
    await answers_as_if_missing(engine, orchestrator_url, task_id)

    # It is there, and its own tenant starts it; finished, it still answers B the same.
    started = await engine.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id), metadata=md("a-orchestrator")
    )
    assert started.status == pb.STARTED
    done = await wait_for_status(engine.stub, task_id, metadata=md("a-orchestrator"))
    assert done.status == pb.SUCCEEDED, done.error
    await answers_as_if_missing(engine, orchestrator_url, task_id)


async def test_another_tenants_closed_task_answers_as_one_that_does_not_exist(
    engine: RunningEngine, orchestrator_url: str
) -> None:
    task_id = await insert_task_at(
        orchestrator_url, closed=True, created_by=USER_A, project_id=PROJECT_A
    )
    await answers_as_if_missing(engine, orchestrator_url, task_id)
    code, said = await refusal(engine, task_id, "a-orchestrator")  # its tenant is told why
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "it is closed" in said


async def test_another_tenants_workflow_whose_task_left_the_table_answers_the_same(
    engine: RunningEngine, orchestrator_url: str
) -> None:
    # The task is gone from their table, its workflow is not: the engine answers from the task
    # stored with the workflow, which is A's.
    task_id = await finished_then_gone(engine, orchestrator_url)
    await answers_as_if_missing(engine, orchestrator_url, task_id)


async def finished_then_gone(
    engine: RunningEngine, orchestrator_url: str, *also: LiteralString
) -> str:
    """A task of A's whose workflow A ran to the end, then deleted from their tasks table
    (and with `also`, these statements run on it too)."""
    task_id = await insert_task_at(
        orchestrator_url, prompt="$ true", created_by=USER_A, project_id=PROJECT_A
    )
    await engine.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id), metadata=md("a-orchestrator")
    )
    done = await wait_for_status(engine.stub, task_id, metadata=md("a-orchestrator"))
    assert done.status == pb.SUCCEEDED, done.error
    async with await psycopg.AsyncConnection.connect(orchestrator_url, autocommit=True) as conn:
        for statement in ("DELETE FROM tasks WHERE id = %(id)s", *also):
            await conn.execute(statement, {"id": task_id})
    return task_id


@pytest.fixture
def mcp_server(orchestrator_url: str) -> Iterator[Served]:
    """The orchestrator's MCP server (tests.integration.capabilities.test_mcp_tasks), on the
    test's orchestrator database."""
    app = orchestrator_mcp(orchestrator_url, "db.task.get", "db.preference.effective")
    served = serve(requiring_token(app.streamable_http_app(host="127.0.0.1")))
    yield served
    served.stop()


async def test_over_mcp_another_tenants_task_answers_as_one_that_does_not_exist(
    settings: Settings, tmp_path: Path, orchestrator_url: str, mcp_server: Served
) -> None:
    mcp = McpSettings(url=mcp_server.url, bearer_token=TOKEN, timeout_seconds=5)
    running = await start_engine(
        on_orchestrator_db(settings, tmp_path, orchestrator_url, task_source="mcp", mcp=mcp)
    )
    try:
        task_id = await insert_task_at(
            orchestrator_url, prompt="$ true", created_by=USER_A, project_id=PROJECT_A
        )
        await answers_as_if_missing(running, orchestrator_url, task_id)
        started = await running.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id), metadata=md("a-orchestrator")
        )
        assert started.status == pb.STARTED
    finally:
        await stop_engine(running)


async def test_a_workflow_whose_stored_task_retention_removed_answers_the_same(
    engine: RunningEngine, orchestrator_url: str
) -> None:
    """As above, after retention removed the task stored with the workflow too: there is no
    task to answer from, so the source's own refusal is the answer, to both tenants."""
    removed = "DELETE FROM workflow_tasks WHERE task_id = %(id)s"
    task_id = await finished_then_gone(engine, orchestrator_url, removed)
    await answers_as_if_missing(engine, orchestrator_url, task_id)
    code, said = await refusal(engine, task_id, "a-orchestrator")
    assert code == grpc.StatusCode.NOT_FOUND and "tasks table" in said, said


async def inline_refusal(running: RunningEngine, task_id: str) -> tuple[Any, str]:
    """What tenant B is answered for a task of its own sent inline under `task_id`."""
    task = pb.TaskSpec(prompt="$ echo b-was-here")
    task.metadata.project_id, task.metadata.user_id = PROJECT_B, USER_A
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await running.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=task), metadata=md("b-orchestrator")
        )
    return refused.value.code(), refused.value.details() or ""


async def test_an_inline_task_may_not_take_another_tenants_task_id(
    engine: RunningEngine, orchestrator_url: str
) -> None:
    """Finding (a) of issue 61's own round: tenant B sends a task of its own inline, under the
    id of A's task in the orchestrator's table. The orchestrator would read B's workflow (its
    status, its summary) as A's task's, and A could not start its own. Refused in the words a
    start of that id without a task gets (a task the table does not have), nothing stored; A
    then starts its task."""
    task_id = await insert_task_at(
        orchestrator_url, prompt="$ true", created_by=USER_A, project_id=PROJECT_A
    )
    before = await snapshot(orchestrator_url)
    code, said = await inline_refusal(engine, task_id)
    assert code == grpc.StatusCode.NOT_FOUND, said
    assert PROJECT_A not in said and USER_A not in said, said
    assert await snapshot(orchestrator_url) == before
    assert (code, said) == await refusal(engine, task_id, "b-orchestrator")
    started = await engine.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id), metadata=md("a-orchestrator")
    )
    assert started.status == pb.STARTED
    done = await wait_for_status(engine.stub, task_id, metadata=md("a-orchestrator"))
    assert done.status == pb.SUCCEEDED and "b-was-here" not in str(done.state), done.error
