"""A task cancelled while it waits for a pooled connection is cancelled, always.

psycopg_pool on Python 3.11 can hand a waiting task its connection in the same moment the task
is cancelled and drop the cancellation (psycopg#1345): the task goes on as if nothing happened.
For the engine's background loops that meant a `close` that never returned (CI hung on it).
`EnginePool` gives the connection back and raises the cancellation instead. The race is hit by
releasing the one connection and cancelling the waiter a varying number of loop turns later.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from workflow_engine.storage._pool import EnginePool

#: Loop turns between the only connection's return and the waiter's cancel: psycopg_pool's own
#: pool lost the cancellation at 1, 2 and 3 of these here (Python 3.11).
TURNS = range(8)
#: How long a cancelled waiter may take to end (it sleeps for a minute if the cancel is lost).
ENDS_WITHIN = 5.0


async def _cancelled_as_the_connection_comes(pool: AsyncConnectionPool[Any], turns: int) -> str:
    """How a waiter cancelled `turns` loop turns after the only connection began to come back
    ended: "cancelled", or "ran on" when it missed its cancellation."""
    held = await pool.getconn()

    async def wait_then_work() -> None:
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")
            await asyncio.sleep(60)  # only reached by a waiter that missed its cancellation

    waiter = asyncio.create_task(wait_then_work())
    for _ in range(5):  # into the pool's queue
        await asyncio.sleep(0)
    returning = asyncio.create_task(pool.putconn(held))
    for _ in range(turns):
        await asyncio.sleep(0)
    waiter.cancel()
    done, _ = await asyncio.wait({waiter}, timeout=ENDS_WITHIN)
    await returning
    if not done:
        waiter.cancel()  # once more, so the test leaves nothing behind
        await asyncio.gather(waiter, return_exceptions=True)
        return "ran on"
    return "cancelled" if waiter.cancelled() else f"ended: {waiter.exception()!r}"


@pytest.mark.timeout(300)
async def test_a_waiter_cancelled_as_its_connection_arrives_is_cancelled(db_url: str) -> None:
    async with EnginePool(db_url, kwargs={"autocommit": True}, min_size=1, max_size=1) as pool:
        ends = {turns: await _cancelled_as_the_connection_comes(pool, turns) for turns in TURNS}
        assert set(ends.values()) == {"cancelled"}, ends
        # And the connection came back each time: the pool still serves.
        async with pool.connection(timeout=5) as conn:
            assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
