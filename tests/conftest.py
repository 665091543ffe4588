"""Shared fixtures: a real PostgreSQL, a fresh database per test, a real gRPC server.

No database is mocked. One server per session (the embedded `pgserver`, or the one named by
``WORKFLOW_ENGINE_TEST_DATABASE_URL``), reached directly or through a pooler (see
`tests.support.database`); every test gets its own database cloned from a migrated template, so
tests
cannot see each other's rows and cloning is fast.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

from tests.support import database
from tests.support.database_supply import DatabaseSupply
from tests.support.helpers import WRITABLE_PATHS, open_to_jobs
from tests.support.pgbouncer import PgBouncer
from workflow_engine._logs import configure_logging
from workflow_engine._serving import GrpcServer
from workflow_engine.capabilities import Capabilities
from workflow_engine.config import JobSettings, Settings
from workflow_engine.engine import Engine
from workflow_engine.storage._database import run_migrations
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

TEMPLATE_DB = f"workflow_engine_template_{os.getpid()}"

# pytest's temporary directories (`tmp_path`: the engines' data directories, the marks jobs
# leave) outside /tmp: a local job has a /tmp of its own (jobwrap), so what it is to share
# with a test must be elsewhere, as a deployment shares a directory with its jobs.
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", "/var/tmp")


# Outside pytest's temporary directories: pytest deletes old ones, which would pull the data
# directory from under a server that another pytest run on this machine is still using.
EMBEDDED_PGDATA = Path(__file__).resolve().parent.parent / ".data" / "test-pgdata"


def pytest_configure(config: pytest.Config) -> None:
    """Start the embedded test server once, before pytest-xdist's workers (who share it)."""
    given = os.environ.get("WORKFLOW_ENGINE_TEST_ADMIN_DATABASE_URL") or os.environ.get(
        "WORKFLOW_ENGINE_TEST_DATABASE_URL"
    )
    if not given and not hasattr(config, "workerinput"):
        config.stash[_EMBEDDED] = database.start_embedded(EMBEDDED_PGDATA)


def pytest_unconfigure(config: pytest.Config) -> None:
    server = config.stash.get(_EMBEDDED, None)
    if server is not None:
        server.cleanup()


_EMBEDDED = pytest.StashKey[Any]()


@pytest.fixture
def tmp_path(tmp_path: Path) -> Path:
    """pytest's `tmp_path`, where local jobs may write too (`helpers.open_to_jobs`)."""
    return open_to_jobs(tmp_path)


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """URL of the session's PostgreSQL server (its maintenance database), reached directly.

    Also sets `tests.support.database.ROUTE`: how tests and engines reach the test databases
    (through a pooler when the environment asks for one).
    """
    configure_logging("warning")
    given = os.environ.get("WORKFLOW_ENGINE_TEST_DATABASE_URL")
    admin = os.environ.get("WORKFLOW_ENGINE_TEST_ADMIN_DATABASE_URL") or given
    server = None
    if not admin:
        server = database.start_embedded(EMBEDDED_PGDATA)  # this process's handle on it
        admin = str(server.get_uri())
    bouncer = None
    if os.environ.get("WORKFLOW_ENGINE_TEST_POOLER") == "pgbouncer":
        # Beside the embedded server, not under pytest's root-only temporary directory: the
        # pooler runs as the server's unprivileged user.
        workdir = EMBEDDED_PGDATA.parent / f"test-pgbouncer-{os.getpid()}"
        shutil.rmtree(workdir, ignore_errors=True)
        bouncer = PgBouncer(admin, workdir)
        database.ROUTE = database.Route(admin, bouncer.url("postgres"), pooled=True)
    else:
        database.ROUTE = database.Route(admin, given or admin, pooled=given not in (None, admin))
    try:
        yield admin
    finally:
        database.ROUTE = None
        if bouncer is not None:
            bouncer.stop()
            shutil.rmtree(bouncer.workdir, ignore_errors=True)
        if server is not None:
            server.cleanup()


@pytest.fixture(scope="session")
async def template_db(pg_server_url: str) -> AsyncIterator[str]:
    """A database with the engine's schema, to clone per test."""
    async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
        await admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {TEMPLATE_DB}")
    url = make_conninfo(pg_server_url, dbname=TEMPLATE_DB)
    async with AsyncConnectionPool(url, kwargs={"autocommit": True}, min_size=1) as pool:
        await run_migrations(pool)
    yield TEMPLATE_DB
    async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
        await admin.execute(f"DROP DATABASE IF EXISTS {TEMPLATE_DB} WITH (FORCE)")


@pytest.fixture(scope="session")
def database_supply(pg_server_url: str, template_db: str) -> Iterator[DatabaseSupply]:
    """Clones of the template, made ahead of the tests that take them (see its module)."""
    supply = DatabaseSupply(pg_server_url, template_db)
    yield supply
    supply.close()


@pytest.fixture
async def db_url(database_supply: DatabaseSupply) -> AsyncIterator[str]:
    """A fresh, migrated database for one test."""
    name = await asyncio.to_thread(database_supply.take)
    assert database.ROUTE is not None
    try:
        yield database.ROUTE.client(name)
    finally:
        database_supply.give_back(name)


@pytest.fixture
async def autocommit_pool(db_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    """A pool of autocommit connections on the test's database, without prepared statements
    (so it works behind a transaction-mode pooler too)."""
    async with AsyncConnectionPool(
        db_url, kwargs={"autocommit": True, "prepare_threshold": None}, min_size=1
    ) as pool:
        yield pool


@pytest.fixture(scope="session", autouse=True)
def jobs_may_write_in_pytests_directories(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """A job sees the host's files read-only but for the directories granted to it
    (``WORKFLOW_ENGINE_JOB_WRITABLE_PATHS``): the directories tests share with their jobs
    (`open_to_jobs`) are pytest's, granted to every engine and node the tests start, in this
    process (`settings`) or not (the variables). Permissions still keep the rest closed."""
    base = str(tmp_path_factory.getbasetemp())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(WRITABLE_PATHS, base)
        patch.setenv("WORKFLOW_ENGINE_NODE_JOB_WRITABLE_PATHS", base)
        yield


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(
        **database.engine_settings(db_url),  # type: ignore[arg-type]
        job=JobSettings(writable_paths=os.environ.get(WRITABLE_PATHS, "")),
        database_url=db_url,
        listen="127.0.0.1:0",
        data_dir=tmp_path / "data",
        holder_id="test-engine",
        lease_ttl_seconds=10,
        drain_timeout_seconds=5,
        pool_min_size=1,
        pool_max_size=8,
        recovery_interval_seconds=0.3,
    )


@dataclass
class RunningEngine:
    """An engine serving gRPC on a free port, and a client channel to it."""

    engine: Engine
    server: GrpcServer
    channel: grpc.aio.Channel
    stub: pb_grpc.WorkflowEngineStub

    @property
    def address(self) -> str:
        return self.server.address


async def start_engine(
    settings: Settings, capabilities: Capabilities | None = None
) -> RunningEngine:
    engine = await Engine(settings, capabilities=capabilities).open()
    server = GrpcServer(engine)
    await server.start()
    channel = grpc.aio.insecure_channel(server.address)
    return RunningEngine(engine, server, channel, pb_grpc.WorkflowEngineStub(channel))


async def stop_engine(running: RunningEngine) -> None:
    await running.channel.close()
    await running.server.stop(drain_timeout=5)


@pytest.fixture
async def running(settings: Settings) -> AsyncIterator[RunningEngine]:
    """One engine (a replica) serving on a free port."""
    replica = await start_engine(settings)
    try:
        yield replica
    finally:
        await stop_engine(replica)


@pytest.fixture
async def second_replica(settings: Settings) -> AsyncIterator[RunningEngine]:
    """Another replica on the same database, with its own holder id and job directory."""
    replica = await start_engine(
        replace(settings, holder_id="test-engine-2", data_dir=settings.data_dir)
    )
    try:
        yield replica
    finally:
        await stop_engine(replica)


@pytest.fixture
async def orchestrator_url(
    pg_server_url: str, request: pytest.FixtureRequest
) -> AsyncIterator[str]:
    """A fresh database with the orchestrator's tables as their ORM makes them (variant
    `request.param`, default plain), then the engine's migrations."""
    from tests.support.orchestrator_schema import create_orchestrator_db

    name = await create_orchestrator_db(pg_server_url, getattr(request, "param", "plain"))
    assert database.ROUTE is not None
    yield database.ROUTE.client(name)
    async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
