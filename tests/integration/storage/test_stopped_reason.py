"""Why a run stopped without ending is recorded only when another writer took its lease away.

`workflow_rows.note_stopped` is called by a run that found its lease gone. It must say so (a
`stopped_reason` and a ``stopped`` event) when the orchestrator released the lease or acquired
it under its own lease id, and say nothing when the engine itself moved on: another replica
took the workflow over, a cancel revoked the lease, or the engine handed it over on drain. A
resume clears it, and so does the end of the workflow.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from tests.integration.orchestrator import their_code
from tests.support.helpers import new_task_id
from workflow_engine.domain import Fence
from workflow_engine.graph.state import initial_state
from workflow_engine.storage import leases, queries, workflow_rows
from workflow_engine.storage._pool import Pool, on_connection
from workflow_engine.storage.workflow_rows import RELEASED_ELSEWHERE

Situation = Callable[[psycopg.AsyncConnection[Any], Pool, Fence, str], Awaitable[None]]
#: The engine process whose runs these are.
PROCESS = "engine/1"


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[Pool]:
    async with AsyncConnectionPool(db_url, kwargs={"autocommit": True}, min_size=1) as pool:
        yield pool


async def _started(pool: Pool) -> tuple[Fence, str]:
    task_id = new_task_id()
    run_id = str(uuid.uuid4())
    started = await workflow_rows.create(
        pool,
        process=PROCESS,
        task_id=task_id,
        run_id=run_id,
        holder_id="engine",
        idempotency_key=None,
        ttl_seconds=30,
        spec={},
        initial_state=dict(initial_state(task_id, run_id)),
    )
    assert started.lease is not None
    return Fence(task_id, started.run_id, "engine", started.lease.epoch), started.lease.lease_id


async def expire(conn: Any, task_id: str) -> None:
    await conn.execute(
        "UPDATE task_workflow_leases SET expires_at = now() - interval '1 second'"
        " WHERE task_id = %s",
        (task_id,),
    )


async def their_release(conn: Any, pool: Pool, fence: Fence, lease_id: str) -> None:
    await their_code.release(conn, fence.task_id, lease_id)


async def their_acquire(conn: Any, pool: Pool, fence: Fence, lease_id: str) -> None:
    await expire(conn, fence.task_id)
    assert (await their_code.acquire(conn, fence.task_id, "their-runner")).status == "started"


async def their_acquire_then_release(conn: Any, pool: Pool, fence: Fence, lease_id: str) -> None:
    await their_acquire(conn, pool, fence, lease_id)
    cur = await conn.execute(
        "SELECT lease_id::text FROM task_workflow_leases WHERE task_id = %s", (fence.task_id,)
    )
    (theirs,) = await cur.fetchone()
    await their_code.release(conn, fence.task_id, theirs)


async def another_replica(conn: Any, pool: Pool, fence: Fence, lease_id: str) -> None:
    await expire(conn, fence.task_id)
    claim = await workflow_rows.claim_for_resume(
        pool, process=PROCESS, task_id=fence.task_id, holder_id="B", ttl_seconds=30
    )
    assert claim.lease is not None


async def a_cancel(conn: Any, pool: Pool, fence: Fence, lease_id: str) -> None:
    await workflow_rows.cancel(pool, fence.task_id, "enough")


async def handed_over(conn: Any, pool: Pool, fence: Fence, lease_id: str) -> None:
    # A drain: the engine hands the lease on.
    assert await on_connection(pool, lambda conn: leases.release(conn, fence))


async def paused(conn: Any, pool: Pool, fence: Fence, lease_id: str) -> None:
    # As the checkpoint write that pauses a workflow leaves it: status waiting, lease released
    # (not handed over: nobody is to carry on until a person decides).
    await conn.execute(
        "UPDATE workflow_checkpoints SET status = 'WAITING_FOR_APPROVAL', event_seq = event_seq"
        " + 1 WHERE task_id = %s",
        (fence.task_id,),
    )
    await conn.execute(
        "UPDATE task_workflow_leases SET holder_id = NULL, expires_at = NULL WHERE task_id = %s",
        (fence.task_id,),
    )


@pytest.mark.parametrize(
    ("situation", "expected"),
    [
        (their_release, RELEASED_ELSEWHERE),
        (their_acquire, "the lease was taken by holder 'their-runner' (not this engine)"),
        (their_acquire_then_release, RELEASED_ELSEWHERE),
        (another_replica, ""),
        (a_cancel, ""),
        (handed_over, ""),
        (paused, ""),
    ],
)
async def test_a_stop_is_recorded_only_when_another_writer_took_the_lease(
    pool: Pool, db_url: str, situation: Situation, expected: str
) -> None:
    fence, lease_id = await _started(pool)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await situation(conn, pool, fence, lease_id)
    before = await queries.get(pool, fence.task_id)
    assert await workflow_rows.note_stopped(pool, fence) == expected
    after = await queries.get(pool, fence.task_id)
    assert after.stopped_reason == expected
    events = await queries.events(pool, fence.task_id, 1)
    if expected:
        assert after.event_seq == before.event_seq + 1 == events[-1].seq
        assert (events[-1].kind, events[-1].detail) == ("stopped", expected)
        assert await workflow_rows.note_stopped(pool, fence) == ""  # once
        assert (await queries.get(pool, fence.task_id)).event_seq == after.event_seq
    else:
        assert after == before
        assert "stopped" not in {e.kind for e in events}


async def test_a_resume_clears_it_and_so_does_the_end(pool: Pool, db_url: str) -> None:
    fence, lease_id = await _started(pool)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await their_code.release(conn, fence.task_id, lease_id)
    assert await workflow_rows.note_stopped(pool, fence)
    claim = await workflow_rows.claim_for_resume(
        pool, process=PROCESS, task_id=fence.task_id, holder_id="x", ttl_seconds=30
    )
    assert claim.lease is not None and claim.record.stopped_reason == ""
    assert (await queries.get(pool, fence.task_id)).stopped_reason == ""

    fence, lease_id = await _started(pool)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await their_code.release(conn, fence.task_id, lease_id)
    assert await workflow_rows.note_stopped(pool, fence)
    cancelled, _ = await workflow_rows.cancel(pool, fence.task_id, "no longer wanted")
    assert cancelled.status == "CANCELLED" and cancelled.stopped_reason == ""
