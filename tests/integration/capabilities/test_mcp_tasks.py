"""The `mcp` task source against a real MCP server made with the same SDK.

The server (`MCPServer`, streamable HTTP, served by uvicorn on a free port in a thread of its
own) answers the task tool from the test database's `tasks` table (structured content), as the
orchestrator's gateway does, and the preferences tool with a fixed object wrapped as theirs is
(``{"effective": ...}``, as text). It refuses requests without the bearer token.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

import grpc
import psycopg
import pytest
import uvicorn
from google.protobuf import json_format
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from psycopg.rows import dict_row

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support import database
from tests.support.helpers import new_task_id, snapshot, stored_task, wait_for_status
from tests.support.orchestrator_schema import insert_task_at
from workflow_engine.config import McpSettings, Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb

TOKEN = "test-token"
PREFERENCES = {"style": {"tone": "brief"}, "max_cost": 3}
USER = "11111111-1111-4111-8111-111111111111"
PROJECT = "22222222-2222-4222-8222-222222222222"
#: Their gateway's names (the defaults), and the names of their newer catalog.
DEFAULT_TOOLS = ("db.task.get", "db.preference.effective")
CATALOG_TOOLS = ("task.get", "preference.effective")

_SELECT_TASK = """
SELECT id::text, status, prompt, summary, created_by::text, project_id::text,
       created_at::text, updated_at::text
  FROM tasks WHERE id = %s
"""


def orchestrator_mcp(db_url: str, task_tool: str, preferences_tool: str) -> MCPServer:
    """Their two tools, over the test database's `tasks` table."""
    server = MCPServer("orchestrator")

    @server.tool(name=task_tool)
    async def get_task(task_id: str) -> dict[str, Any]:
        async with await psycopg.AsyncConnection.connect(db_url, row_factory=dict_row) as conn:
            cur = await conn.execute(_SELECT_TASK, (task_id,))
            row = await cur.fetchone()
        if row is None:
            raise ToolError('{"error":"not found"}')
        return row

    # As text only, the way their gateway's JSON body would come through.
    @server.tool(name=preferences_tool, structured_output=False)
    async def effective_preferences(task_id: str) -> str:
        return json.dumps({"effective": PREFERENCES})

    return server


def requiring_token(app: Any) -> Any:
    """The app, answering 401 to a request without the bearer token."""

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != f"Bearer {TOKEN}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await app(scope, receive, send)

    return guarded


@dataclass
class Served:
    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def serve(app: Any, lifespan: Literal["auto", "off"] = "auto") -> Served:
    """`app` on a free port, in a thread with its own event loop."""
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=0,
        log_level="warning",
        lifespan=lifespan,
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(500):
        if server.started:
            break
        threading.Event().wait(0.01)
    assert server.started, "the MCP server did not start"
    port = server.servers[0].sockets[0].getsockname()[1]
    return Served(f"http://127.0.0.1:{port}/mcp", server, thread)


@pytest.fixture
def tools() -> tuple[str, str]:
    """The server's task and preferences tool names; a test parametrizes it to change them."""
    return DEFAULT_TOOLS


@pytest.fixture
def mcp_server(orchestrator_url: str, tools: tuple[str, str]) -> Iterator[Served]:
    """The orchestrator's MCP server, on the test database, with the tool names `tools`."""
    app = orchestrator_mcp(orchestrator_url, *tools)
    served = serve(requiring_token(app.streamable_http_app(host="127.0.0.1")))
    yield served
    served.stop()


StartFor = Callable[..., Awaitable[RunningEngine]]


def with_mcp(settings: Settings, url: str, db_url: str, **mcp: Any) -> Settings:
    return replace(
        settings,
        database_url=db_url,
        **database.engine_settings(db_url),  # type: ignore[arg-type]
        task_source="mcp",
        mcp=McpSettings(**{"url": url, "bearer_token": TOKEN, "timeout_seconds": 5, **mcp}),
    )


@pytest.fixture
async def engine_for(settings: Settings, orchestrator_url: str) -> AsyncIterator[StartFor]:
    """Starts an engine whose `mcp` source asks `url`; stopped after the test."""
    started: list[RunningEngine] = []

    async def start(url: str, **mcp: Any) -> RunningEngine:
        running = await start_engine(with_mcp(settings, url, orchestrator_url, **mcp))
        started.append(running)
        return running

    yield start
    for running in started:
        await stop_engine(running)


async def refused(
    running: RunningEngine, task_id: str, code: grpc.StatusCode, url: str, contains: str
) -> None:
    """StartWorkflow of `task_id` fails with `code`, and nothing is stored."""
    before = await snapshot(url)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id))
    assert err.value.code() == code, err.value.details()
    assert contains in (err.value.details() or ""), err.value.details()
    assert await snapshot(url) == before  # no workflow row, no lease, no stored task


@pytest.mark.parametrize("tools", [DEFAULT_TOOLS, CATALOG_TOOLS])
async def test_a_task_is_started_by_id_from_the_mcp_tools(
    mcp_server: Served, engine_for: StartFor, orchestrator_url: str, tools: tuple[str, str]
) -> None:
    """The task as the task tool has it, the preferences as a layer, stored with the workflow
    and run. The defaults are their gateway's tool names; other names are configured."""
    task_tool, preferences_tool = tools
    names = (
        {}
        if tools == DEFAULT_TOOLS
        else {"task_tool": task_tool, "preferences_tool": preferences_tool}
    )
    running = await engine_for(mcp_server.url, **names)
    task_id = await insert_task_at(
        orchestrator_url,
        prompt="Greet\n$ echo hello",
        summary="Greeting",
        created_by=USER,
        project_id=PROJECT,
    )
    started = await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id))
    assert started.status == pb.STARTED

    spec = await stored_task(orchestrator_url, task_id)
    assert spec.prompt == "Greet\n$ echo hello"
    assert spec.preferences == (PREFERENCES,)
    assert (spec.metadata.user_id, spec.metadata.project_id) == (USER, PROJECT)
    assert spec.metadata.labels == {"name": "Greeting"}
    done = await wait_for_status(running.stub, task_id)
    assert done.status == pb.SUCCEEDED, done.error
    state = json_format.MessageToDict(done.state)
    assert state["preferences_effective"] == PREFERENCES
    assert [r["stdout"] for r in state["results"]] == ["hello\n"]


async def test_an_unknown_task_is_not_found(
    mcp_server: Served, engine_for: StartFor, orchestrator_url: str
) -> None:
    running = await engine_for(mcp_server.url)
    task_id = new_task_id()
    await refused(
        running, task_id, grpc.StatusCode.NOT_FOUND, orchestrator_url, f"task {task_id} not found"
    )


async def test_a_completed_task_is_not_startable(
    mcp_server: Served, engine_for: StartFor, orchestrator_url: str
) -> None:
    running = await engine_for(mcp_server.url)
    task_id = await insert_task_at(orchestrator_url, status="completed")
    await refused(
        running,
        task_id,
        grpc.StatusCode.FAILED_PRECONDITION,
        orchestrator_url,
        "its status is 'completed'",
    )


async def test_a_tool_name_the_server_lacks_is_unavailable_naming_it(
    mcp_server: Served, engine_for: StartFor, orchestrator_url: str
) -> None:
    running = await engine_for(mcp_server.url, task_tool="tasks.fetch")
    task_id = await insert_task_at(orchestrator_url)
    await refused(
        running, task_id, grpc.StatusCode.UNAVAILABLE, orchestrator_url, "tool tasks.fetch failed"
    )


async def test_a_server_that_is_down_is_unavailable_and_nothing_is_stored(
    engine_for: StartFor, orchestrator_url: str
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    running = await engine_for(f"http://127.0.0.1:{port}/mcp")
    task_id = await insert_task_at(orchestrator_url)
    await refused(running, task_id, grpc.StatusCode.UNAVAILABLE, orchestrator_url, "ConnectError")


async def test_a_wrong_token_is_unavailable(
    mcp_server: Served, settings: Settings, orchestrator_url: str
) -> None:
    wrong = with_mcp(settings, mcp_server.url, orchestrator_url)
    running = await start_engine(replace(wrong, mcp=replace(wrong.mcp, bearer_token="nope")))
    try:
        task_id = await insert_task_at(orchestrator_url)
        await refused(
            running, task_id, grpc.StatusCode.UNAVAILABLE, orchestrator_url, "could not be used"
        )
    finally:
        await stop_engine(running)


async def test_a_server_that_does_not_answer_in_time_is_unavailable(
    engine_for: StartFor, orchestrator_url: str
) -> None:
    async def silent(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(30)

    served = serve(silent, lifespan="off")
    try:
        running = await engine_for(served.url, timeout_seconds=0.5)
        task_id = await insert_task_at(orchestrator_url)
        await refused(
            running, task_id, grpc.StatusCode.UNAVAILABLE, orchestrator_url, "no answer in time"
        )
    finally:
        served.stop()
