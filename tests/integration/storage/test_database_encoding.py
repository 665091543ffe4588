"""The engine works on a database whatever its encoding: it asks for UTF-8 on every connection.

A SQL_ASCII database (an old cluster's initdb default, or a restored dump's) otherwise hands
text over as bytes, and the first query comparing a uuid fails.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace

import psycopg
import pytest

from tests.conftest import start_engine, stop_engine
from tests.support import database
from tests.support.helpers import new_task_id, step, task, wait_for_status
from workflow_engine.config import Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb


@pytest.fixture
async def ascii_db_url(pg_server_url: str) -> AsyncIterator[str]:
    name = f"t_ascii_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
        await admin.execute(
            f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'"
            " TEMPLATE template0"
        )
    assert database.ROUTE is not None
    yield database.ROUTE.client(name)
    async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def test_a_sql_ascii_database_keeps_text_whole(settings: Settings, ascii_db_url: str) -> None:
    on_ascii = replace(
        settings, **database.engine_settings(ascii_db_url), database_url=ascii_db_url
    )
    running = await start_engine(on_ascii)  # the migrations run on it
    try:
        task_id = new_task_id()
        prompt = "Grüße aus Köln, 東京 and back"
        spec = task(step("greet", "echo", "Grüße"), prompt=prompt)
        await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        wf = await wait_for_status(running.stub, task_id)
    finally:
        await stop_engine(running)
    assert wf.status == pb.SUCCEEDED, wf.error
    assert wf.state["prompt"] == prompt
    assert wf.state["steps"]["greet"]["result"]["stdout"] == "Grüße\n"
