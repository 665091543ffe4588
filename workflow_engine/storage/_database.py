"""The engine's database: which server (the configured one, or the embedded one), its pool,
its schema.

Every way in (the engine, `workflow-engine migrate`, the supervisor) opens it here:
`database_url` reaches the configured server, or the embedded one is started and stopped again
when the block ends (see `storage._embedded`); `open_pool` opens the engine's pool on it, and
`migrate_database` brings its schema up to date.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from psycopg import AsyncConnection
from psycopg.types.json import set_json_dumps, set_json_loads

from workflow_engine.config import Settings
from workflow_engine.storage._embedded import start_embedded_postgres
from workflow_engine.storage._migrations import migrate
from workflow_engine.storage._pool import EnginePool, Pool


@asynccontextmanager
async def database_url(settings: Settings) -> AsyncIterator[str]:
    """The configured database's URL; without one, the embedded server's, for the block.

    The embedded server stops when the block ends if this process started it (see
    `storage._embedded`), whether the block ends normally or by an exception.
    """
    if settings.database_url:
        yield settings.database_url
        return
    embedded = start_embedded_postgres(settings.embedded_pgdata)
    try:
        yield embedded.url
    finally:
        await asyncio.to_thread(embedded.close)


async def configure_connection(conn: AsyncConnection[Any]) -> None:
    """Per-connection set-up of the engine's pool (nothing is changed process-wide).

    orjson encodes and decodes JSON several times faster than the standard library; the state
    written after every node is JSON, so this is on the hot path.
    """
    set_json_dumps(orjson.dumps, conn)
    set_json_loads(orjson.loads, conn)


async def open_pool(url: str, settings: Settings) -> Pool:
    pool: Pool = EnginePool(
        url,
        min_size=settings.pool_min_size,
        max_size=settings.pool_max_size,
        kwargs={
            "autocommit": True,
            "prepare_threshold": settings.prepare_threshold,
            # Text is UTF-8 whatever the database's encoding: a SQL_ASCII one would otherwise
            # hand it over as bytes.
            "client_encoding": "utf8",
        },
        configure=configure_connection,
        open=False,
        name="workflow-engine",
    )
    try:
        await pool.open(wait=True, timeout=30)
    except BaseException:  # not there in time, or a stop during start-up: no workers left behind
        await pool.close()
        raise
    return pool


async def run_migrations(pool: Pool) -> int:
    """Apply the migrations `pool`'s database lacks; how many were applied."""
    async with pool.connection() as conn:
        return await migrate(conn)


async def migrate_database(url: str, settings: Settings) -> int:
    """Bring the schema at `url` up to date on a pool of its own, closed after."""
    pool = await open_pool(url, settings)
    try:
        return await run_migrations(pool)
    finally:
        await pool.close()
