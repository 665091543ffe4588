"""Behind a transaction-mode PgBouncer: no wrong prepared statement, no lost notification.

Each test starts its own PgBouncer (Debian's package) in front of the session's server, whatever
route the rest of the suite takes, and runs the installed `workflow-engine serve` through it with
the settings docs/operations.md gives for a pooler: `WORKFLOW_ENGINE_DATABASE_PREPARE=off`
and a listen URL straight to PostgreSQL (or `none`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests.conftest import EMBEDDED_PGDATA
from tests.support import database
from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, step, task, wait_for_status, watch_until_end
from tests.support.pgbouncer import PgBouncer, binary
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        binary() is None, reason="pgbouncer is not installed (make test installs it)"
    ),
]

# What a statement run against another connection's prepared statement looks like, in the
# engine's log or the pooler's.
WRONG_STATEMENT = ("prepared statement", "protocol violation", "bind message supplies", "08P01")


@pytest.fixture
def bouncer(pg_server_url: str) -> Iterator[PgBouncer]:
    workdir = Path(__file__).resolve().parents[2] / ".data" / f"pgbouncer-e2e-{time.time_ns()}"
    pooler = PgBouncer(pg_server_url, workdir, pool_size=5)
    try:
        yield pooler
    finally:
        pooler.stop()


def dbname(db_url: str) -> str:
    return str(conninfo_to_dict(db_url)["dbname"])


def engine_behind(
    bouncer: PgBouncer, db_url: str, tmp_path: Path, holder: str, **settings: str
) -> EngineProcess:
    assert database.ROUTE is not None
    env = {
        "WORKFLOW_ENGINE_DATABASE_URL": bouncer.url(dbname(db_url)),
        "WORKFLOW_ENGINE_DATABASE_PREPARE": "off",
        "WORKFLOW_ENGINE_LISTEN_DATABASE_URL": database.ROUTE.direct(dbname(db_url)),
        **{f"WORKFLOW_ENGINE_{k.upper()}": v for k, v in settings.items()},
    }
    return EngineProcess(db_url=None, data_dir=tmp_path / "data", holder_id=holder, extra_env=env)


async def listeners(db_url: str) -> int:
    """Backends of this database whose last statement was a LISTEN."""
    assert database.ROUTE is not None
    async with await psycopg.AsyncConnection.connect(database.ROUTE.direct(dbname(db_url))) as c:
        cur = await c.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN%%'"
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def test_fifty_concurrent_workflows_run_with_no_wrong_statement(
    bouncer: PgBouncer, db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    server_log = EMBEDDED_PGDATA / "log"  # the embedded server's own log, when it is the server
    log_start = server_log.stat().st_size if server_log.exists() else None
    engine = engine_behind(bouncer, db_url, tmp_path, "pooled", worker="simulated")
    processes.append(engine)
    spec = task(*(step(f"s{i}", "echo", str(i)) for i in range(3)))
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        ids = [new_task_id() for _ in range(50)]
        await asyncio.gather(
            *(stub.StartWorkflow(pb.StartWorkflowRequest(task_id=t, task=spec)) for t in ids)
        )
        done = await asyncio.gather(*(wait_for_status(stub, t, timeout=120) for t in ids))
    assert [wf.status for wf in done] == [pb.SUCCEEDED] * 50
    assert await listeners(db_url) == 1  # the engine's own, straight to PostgreSQL
    engine.terminate()
    logged = [str(entry) for entry in engine.logs]
    assert not [line for line in logged if any(w in line for w in WRONG_STATEMENT)]
    assert not [e for e in engine.logs if e.get("event") == "db_retry"]
    pooler_log = bouncer.log_text()
    assert not [w for w in WRONG_STATEMENT if w in pooler_log]
    if log_start is not None:
        with server_log.open("rb") as handle:
            handle.seek(log_start)
            written = handle.read().decode(errors="replace")
        assert not [w for w in WRONG_STATEMENT if w in written], written[-2000:]


async def test_watch_is_woken_through_the_listen_url_not_by_polling(
    bouncer: PgBouncer, db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    """Polling every 60 s, a watch of a 12-event workflow would take minutes; the notification
    from the direct listener wakes it for each event."""
    engine = engine_behind(
        bouncer, db_url, tmp_path, "listening", worker="simulated", watch_poll_seconds="60"
    )
    processes.append(engine)
    task_id = new_task_id()
    spec = task(step("a", "sleep", "0.2"), step("b", "sleep", "0.2"), step("c", "sleep", "0.2"))
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        events = await watch_until_end(stub, task_id, timeout=30)
    assert events[-1].status == pb.SUCCEEDED
    assert len(events) >= 12


async def test_notifications_off_polls_and_never_listens(
    bouncer: PgBouncer, db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    engine = engine_behind(
        bouncer,
        db_url,
        tmp_path,
        "polling",
        worker="simulated",
        listen_database_url="none",
        watch_poll_seconds="0.1",
    )
    processes.append(engine)
    task_id = new_task_id()
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        await stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=task(step("a", "sleep", "0.3")))
        )
        events = await watch_until_end(stub, task_id, timeout=30)
    assert events[-1].status == pb.SUCCEEDED
    assert engine.count("watch_notifications_off") == 1
    assert await listeners(db_url) == 0
