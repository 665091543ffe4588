"""One unit of storage work on a pooled connection, retried as `retry` allows.

`on_connection` runs statements that need no transaction of their own (a read, a single
statement); `in_transaction` runs them in one transaction. Either may run the operation more
than once (see `with_retry`), so it must be safe to repeat.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from workflow_engine.storage.retry import DEFAULT_MAX_SECONDS, with_retry

T = TypeVar("T")

#: The connection pool every storage call takes (psycopg's async pool).
Pool: TypeAlias = AsyncConnectionPool[Any]
Connection: TypeAlias = AsyncConnection[Any]


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
