"""The engine's pool, and one unit of storage work on a pooled connection, retried as `_retry`
allows.

`on_connection` runs statements that need no transaction of their own (a read, a single
statement); `in_transaction` runs them in one transaction. Either may run the operation more
than once (see `with_retry`), so it must be safe to repeat.

`EnginePool` is psycopg's pool with one fix: a task cancelled while it waits for a connection
is cancelled, even when the pool hands it one in the same moment. On Python 3.11 psycopg_pool's
wait (`asyncio.wait_for` around a condition) can swallow that cancellation (psycopg#1345), and
a background loop whose cancellation is lost never ends, so the engine's `close` never did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from workflow_engine.storage._retry import DEFAULT_MAX_SECONDS, with_retry

T = TypeVar("T")

#: The connection pool every storage call takes (psycopg's async pool).
Pool: TypeAlias = AsyncConnectionPool[Any]
Connection: TypeAlias = AsyncConnection[Any]


class EnginePool(AsyncConnectionPool[Any]):
    """psycopg's async pool, whose `getconn` never loses its caller's cancellation."""

    # psycopg's signature, `timeout` and all.
    async def getconn(self, timeout: float | None = None) -> Connection:  # noqa: ASYNC109
        task = asyncio.current_task()
        requested = task.cancelling() if task is not None else 0
        conn: Connection = await super().getconn(timeout)
        if task is not None and task.cancelling() > requested:
            # Cancelled during the wait, yet handed a connection: the cancellation was lost
            # on the way. Give the connection back and be cancelled, as the caller asked.
            await self.putconn(conn)
            raise asyncio.CancelledError
        return conn


async def on_connection(
    pool: Pool,
    operation: Callable[[Connection], Awaitable[T]],
    *,
    max_seconds: float = DEFAULT_MAX_SECONDS,
) -> T:
    """`operation` on a connection from `pool`; transient failures retried on a new one."""

    async def once() -> T:
        async with pool.connection() as conn:
            return await operation(conn)

    return await with_retry(once, max_seconds=max_seconds)


async def in_transaction(
    pool: Pool,
    operation: Callable[[Connection], Awaitable[T]],
    *,
    max_seconds: float = DEFAULT_MAX_SECONDS,
) -> T:
    """`operation` in one transaction, which an exception from it rolls back; retried whole."""

    async def once() -> T:
        async with pool.connection() as conn, conn.transaction():
            return await operation(conn)

    return await with_retry(once, max_seconds=max_seconds)
