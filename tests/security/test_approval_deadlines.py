"""An approval request's expiry as an attacker meets it: whoever can write the table can set a
row's `wake_at`, its state, its owner or its format; a caller can send any timeout. None of it
makes a request expire early, an expiry apply twice, or the sweep touch a row that is not the
engine's to change: the change re-checks the state's own expiry under the lease, and the sweep
selects only the engine's readable, unblocked waiting rows."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.clock import ManualClock
from tests.support.helpers import new_task_id, snapshot, step, task, wait_for_status
from workflow_engine.config import Settings
from workflow_engine.domain.deadlines import MAX_APPROVAL_TIMEOUT_SECONDS
from workflow_engine.errors import InvalidState, ResourceExhausted
from workflow_engine.runtime._deadlines import DeadlineSweep
from workflow_engine.v1 import workflow_engine_pb2 as pb

WAITING = {pb.WAITING_FOR_APPROVAL}


@pytest.fixture
async def timely(settings: Settings) -> AsyncIterator[RunningEngine]:
    """An engine whose timer sweep looks every 50 ms."""
    replica = await start_engine(replace(settings, timer_interval_seconds=0.05))
    try:
        yield replica
    finally:
        await stop_engine(replica)


@pytest.fixture
async def idle_timer(settings: Settings) -> AsyncIterator[RunningEngine]:
    """An engine whose own sweep waits a minute: the test applies expiries itself."""
    replica = await start_engine(replace(settings, timer_interval_seconds=60))
    try:
        yield replica
    finally:
        await stop_engine(replica)


async def waiting(running: RunningEngine, timeout: int) -> str:
    task_id = new_task_id()
    spec = task(step("ship", "true", requires_approval=True, approval_timeout_seconds=timeout))
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    await wait_for_status(running.stub, task_id, WAITING)
    return task_id


async def sql(db_url: str, statement: str, task_id: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(statement, (task_id,))


async def settled(db_url: str) -> dict[str, list[object]]:
    """The database once the waiting runs have released their leases."""
    await asyncio.sleep(0.3)
    return await snapshot(db_url)


async def test_a_wake_at_set_in_the_past_does_not_make_a_request_expire_early(
    timely: RunningEngine, db_url: str
) -> None:
    """The longest timeout a caller may ask for, and a `wake_at` an attacker moved a day into
    the past: the sweep finds the row due, but its state is not, so nothing is taken or
    written (no lease, no event), round after round."""
    task_id = await waiting(timely, MAX_APPROVAL_TIMEOUT_SECONDS)
    await sql(
        db_url,
        "UPDATE workflow_checkpoints SET wake_at = now() - interval '1 day' WHERE task_id = %s",
        task_id,
    )
    before = await settled(db_url)
    await asyncio.sleep(1.0)  # some twenty rounds of the sweep
    assert await snapshot(db_url) == before
    assert await timely.engine.service.expire(task_id) is None
    # ... and it still waits: the snapshots alone would not see an expiry applied before the
    # first of them was taken.
    shown = await timely.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert shown.status == pb.WAITING_FOR_APPROVAL


async def test_an_expiry_asked_twice_at_once_applies_once_and_never_again(
    idle_timer: RunningEngine, db_url: str
) -> None:
    task_id = await waiting(idle_timer, 1)
    await asyncio.sleep(1.2)
    service = idle_timer.engine.service
    outcomes = await asyncio.gather(
        service.expire(task_id), service.expire(task_id), return_exceptions=True
    )
    applied = [o for o in outcomes if o == "reject"]
    refused = [o for o in outcomes if o is None or isinstance(o, InvalidState)]
    assert (len(applied), len(refused)) == (1, 1), outcomes
    done = await wait_for_status(idle_timer.stub, task_id)
    assert done.status == pb.FAILED
    assert [e.actor for e in done.history if e.kind == pb.APPROVAL_DECIDED] == ["deadline"]
    # A wake_at set again on the finished row: not a waiting row, never selected or applied.
    await sql(
        db_url,
        "UPDATE workflow_checkpoints SET wake_at = now() - interval '1 day' WHERE task_id = %s",
        task_id,
    )
    before = await settled(db_url)
    assert await service.expire(task_id) is None
    assert await snapshot(db_url) == before


@pytest.mark.parametrize(
    "tamper",
    [
        # Another writer's row (the engine never changes one).
        "UPDATE workflow_checkpoints SET engine_owned = false WHERE task_id = %s",
        # A newer engine's row (this one does not read it).
        "UPDATE workflow_checkpoints SET state_format = 99, event_seq = event_seq + 1"
        " WHERE task_id = %s",
        # A state edited by another writer to look expired: changed outside, held for an
        # operator, never acted on by the sweep.
        "UPDATE workflow_checkpoints SET state = jsonb_set(state,"
        " '{pending_approval,requested_at}', '0') WHERE task_id = %s",
    ],
    ids=["not-engine-owned", "newer-format", "changed-outside"],
)
async def test_the_sweep_never_touches_a_row_that_is_not_the_engine_s_to_change(
    timely: RunningEngine, db_url: str, tamper: str
) -> None:
    task_id = await waiting(timely, 1)
    await sql(db_url, tamper, task_id)
    await sql(
        db_url,
        "UPDATE workflow_checkpoints SET wake_at = now() - interval '1 hour' WHERE task_id = %s",
        task_id,
    )
    before = await settled(db_url)
    await asyncio.sleep(1.5)  # past the request's own expiry, some thirty rounds
    assert await snapshot(db_url) == before


_WAITING_ROWS = """
INSERT INTO workflow_checkpoints
    (id, task_id, state, last_node_id, updated_at, created_at, run_id, status, event_seq,
     engine_owned, state_format, project_id, wake_at)
SELECT gen_random_uuid(), gen_random_uuid(), '{}'::jsonb, 'dispatch_step', now(), now(),
       gen_random_uuid(), 'WAITING_FOR_APPROVAL', 4, true, 1, %(project)s,
       now() - make_interval(secs => %(age)s)
  FROM generate_series(1, %(count)s)
RETURNING task_id::text
"""


async def test_a_tenant_whose_expiries_are_stuck_does_not_hold_off_another(
    autocommit_pool: Any,
) -> None:
    """Tenant A has 150 expired waits whose expiries cannot be applied now (A is at its cap
    of running workflows); tenant B's, due later than all of them, is applied in the first
    round, and A's stuck rows are left out of the next round for a while."""
    async with autocommit_pool.connection() as conn:
        cur = await conn.execute(_WAITING_ROWS, {"project": "project-a", "age": 3600, "count": 150})
        stuck = {row[0] for row in await cur.fetchall()}
        cur = await conn.execute(_WAITING_ROWS, {"project": "project-b", "age": 1, "count": 1})
        (theirs,) = [row[0] for row in await cur.fetchall()]
    tried: list[str] = []

    async def expire(task_id: str) -> str | None:
        tried.append(task_id)
        if task_id in stuck:
            raise ResourceExhausted("project-a is running as many workflows as it may")
        return "reject"

    clock = ManualClock(start=time.time())
    sweep = DeadlineSweep(pool=autocommit_pool, expire=expire, clock=clock, interval_seconds=1)
    assert await sweep.sweep() == 1
    first = set(tried)
    clock.advance(1)
    await sweep.sweep()
    second = set(tried) - first
    assert theirs in first and len(first) == 21  # at most 20 of A's in one round, and B's
    assert len(second) == 20 and second <= stuck  # 20 others; the first wait out a back-off
