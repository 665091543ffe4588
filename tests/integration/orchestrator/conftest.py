"""An engine on a database whose orchestrator tables were created first, by their ORM's rules,
in each variant of `tests.support.orchestrator_schema` (no foreign keys, foreign keys, soft
delete)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import psycopg
import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support import database
from tests.support.orchestrator_schema import VARIANTS, create_orchestrator_db
from workflow_engine.config import Settings


@pytest.fixture(params=VARIANTS)
async def orch_db(request: pytest.FixtureRequest, pg_server_url: str) -> AsyncIterator[str]:
    """A database with the orchestrator's tables only (its name); the engine's start migrates."""
    name = await create_orchestrator_db(pg_server_url, request.param, migrate=False)
    yield name
    async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def variant(orch_db: str) -> str:
    return orch_db.removeprefix("orch_").rsplit("_", 1)[0]


@pytest.fixture
def direct_url(orch_db: str) -> str:
    """The database reached directly: their code's statements, and the tests' checks."""
    assert database.ROUTE is not None
    return database.ROUTE.direct(orch_db)


@pytest.fixture
async def engine(orch_db: str, settings: Settings) -> AsyncIterator[RunningEngine]:
    assert database.ROUTE is not None
    url = database.ROUTE.client(orch_db)
    replica = await start_engine(
        replace(
            settings,
            database_url=url,
            recovery_interval_seconds=0.2,
            **database.engine_settings(url),  # type: ignore[arg-type]
        )
    )
    try:
        yield replica
    finally:
        await stop_engine(replica)
