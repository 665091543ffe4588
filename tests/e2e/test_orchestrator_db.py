"""A new user's path: the orchestrator's tables exist as their ORM made them (with their spec's
foreign keys), then `workflow-engine migrate`, then `workflow-engine serve`, then grpcurl."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from asyncio.subprocess import PIPE
from pathlib import Path

import psycopg
import pytest

from tests.support import database
from tests.support.engine_process import ENGINE, EngineProcess
from tests.support.helpers import new_task_id
from tests.support.orchestrator_schema import create_orchestrator_db, insert_task

GRPCURL = Path(sys.executable).parent / "grpcurl"
pytestmark = pytest.mark.e2e


async def run(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=PIPE, stderr=PIPE, env=env)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


async def grpcurl(address: str, method: str, body: dict[str, object]) -> tuple[int, str, str]:
    return await run(
        str(GRPCURL),
        "-plaintext",
        "-d",
        json.dumps(body),
        address,
        f"workflow_engine.v1.WorkflowEngine/{method}",
    )


async def test_migrate_then_start_on_their_tables(pg_server_url: str, tmp_path: Path) -> None:
    name = await create_orchestrator_db(pg_server_url, "fks", migrate=False)
    assert database.ROUTE is not None
    url, direct = database.ROUTE.client(name), database.ROUTE.direct(name)
    try:
        env = {**os.environ, "WORKFLOW_ENGINE_DATABASE_URL": url, **database.engine_env(url)}
        code, _, err = await run(str(ENGINE), "migrate", env=env)
        assert code == 0, err
        async with await psycopg.AsyncConnection.connect(direct, autocommit=True) as conn:
            task_id = await insert_task(conn, prompt="$ echo hello")
        engine = EngineProcess(db_url=url, data_dir=tmp_path / "data", holder_id="e2e")
        try:
            task = {"prompt": "$ echo hello"}
            code, out, err = await grpcurl(
                engine.address, "StartWorkflow", {"task_id": task_id, "task": task}
            )
            assert code == 0, err
            assert json.loads(out)["status"] == "STARTED"
            unknown = new_task_id()
            code, _, err = await grpcurl(
                engine.address, "StartWorkflow", {"task_id": unknown, "task": task}
            )
            assert code != 0 and "NotFound" in err and unknown in err, err
            for _ in range(600):
                _, out, _ = await grpcurl(engine.address, "GetWorkflow", {"task_id": task_id})
                if json.loads(out).get("status") == "SUCCEEDED":
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"the workflow did not finish: {out}")
        finally:
            engine.terminate()
        async with await psycopg.AsyncConnection.connect(direct) as conn:
            cur = await conn.execute(
                "SELECT id IS NOT NULL, engine_owned FROM workflow_checkpoints WHERE task_id = %s",
                (task_id,),
            )
            assert await cur.fetchone() == (True, True)
            cur = await conn.execute(
                "SELECT (SELECT count(*) FROM task_workflow_leases WHERE task_id = %(t)s)"
                " + (SELECT count(*) FROM workflow_checkpoints WHERE task_id = %(t)s)",
                {"t": unknown},
            )
            assert await cur.fetchone() == (0,)  # the refused start stored nothing
    finally:
        async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
