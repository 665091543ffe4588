"""A runner whose lease was taken over (a zombie) cannot write a checkpoint."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from tests.conftest import RunningEngine
from tests.support.helpers import new_task_id, step, task
from workflow_engine.domain.records import Fence, StartOutcome
from workflow_engine.errors import LeaseLost
from workflow_engine.graph.state import STATE_KEYS, initial_state
from workflow_engine.runtime._run import Run
from workflow_engine.storage import leases, queries, workflow_rows
from workflow_engine.storage._checkpointer import Checkpoint, RowCheckpointer
from workflow_engine.v1 import workflow_engine_pb2 as pb

EXPIRE = "UPDATE task_workflow_leases SET expires_at = now() - interval '1 second'"


@dataclass
class WriterContext:
    """What a run hands the checkpointer: its fence, and the node that just finished."""

    fence: Fence
    node: str | None = "load_task_context"
    written: list[str] = field(default_factory=list)


@pytest.fixture
async def pool(db_url: str) -> AsyncIterator[AsyncConnectionPool[Any]]:
    async with AsyncConnectionPool(db_url, kwargs={"autocommit": True}, min_size=1) as p:
        yield p


async def put(saver: RowCheckpointer, ctx: WriterContext, note: str) -> None:
    assert ctx.node is not None
    state = {**initial_state(ctx.fence.task_id, ctx.fence.run_id), "summary": note}
    checkpoint = Checkpoint.fresh(state, ctx.node).after(ctx.node, state, ["summary"], None)
    await saver.write(ctx.fence, checkpoint, {"node": ctx.node, "kind": "node"})
    ctx.written.append(ctx.node)  # reached only when the write landed (else LeaseLost)
    ctx.node = None


@pytest.fixture
async def saver(pool: AsyncConnectionPool[Any]) -> AsyncIterator[RowCheckpointer]:
    saver = RowCheckpointer(pool, state_keys=STATE_KEYS)
    yield saver
    await saver.close()  # stop its group-commit flushers


async def create_as_a(pool: AsyncConnectionPool[Any]) -> StartOutcome:
    task_id = new_task_id()
    run_id = str(uuid.uuid4())
    return await workflow_rows.create(
        pool,
        process="",
        task_id=task_id,
        run_id=run_id,
        holder_id="A",
        idempotency_key=None,
        ttl_seconds=30,
        spec={},
        initial_state=dict(initial_state(task_id, run_id)),
    )


async def test_zombie_write_is_rejected_after_takeover(
    pool: AsyncConnectionPool[Any], saver: RowCheckpointer, db_url: str
) -> None:
    started = await create_as_a(pool)
    task_id = started.lease.task_id
    a = WriterContext(Fence(task_id, started.run_id, "A", started.lease.epoch))
    await put(saver, a, "written by A")
    assert a.written == ["load_task_context"]

    # A stalls past its lease; B takes the task over.
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(EXPIRE)
    claim = await workflow_rows.claim_for_resume(
        pool, process="", task_id=task_id, holder_id="B", ttl_seconds=30
    )
    assert claim.lease is not None and claim.lease.epoch == started.lease.epoch + 1

    # A wakes up: its write, renewal and release all fail, and change nothing.
    a.node = "plan_steps"
    with pytest.raises(LeaseLost):
        await put(saver, a, "stale write by A")
    async with pool.connection() as conn:
        assert await leases.renew(conn, a.fence, 30) is None
        assert await leases.release(conn, a.fence) is False
    record = await queries.get(pool, task_id)
    assert record.state["summary"] == "written by A"
    assert record.last_node_id == "load_task_context"
    assert record.lease_holder_id == "B"

    b = WriterContext(Fence(task_id, started.run_id, "B", claim.lease.epoch), node="plan_steps")
    await put(saver, b, "written by B")
    assert (await queries.get(pool, task_id)).state["summary"] == "written by B"


async def test_expired_lease_cannot_write_even_before_a_takeover(
    pool: AsyncConnectionPool[Any], saver: RowCheckpointer, db_url: str
) -> None:
    started = await create_as_a(pool)
    task_id = started.lease.task_id
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(EXPIRE)
    a = WriterContext(Fence(task_id, started.run_id, "A", started.lease.epoch))
    with pytest.raises(LeaseLost):
        await put(saver, a, "too late")


async def started_mid_step(running: RunningEngine) -> tuple[str, Run]:
    """A two-step workflow whose first (1.5 s) step has just been dispatched, and its run."""
    task_id = new_task_id()
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(
            task_id=task_id, task=task(step("slow", "sleep", "1.5"), step("next", "true"))
        )
    )
    run = running.engine.runs.get(task_id)
    assert run is not None
    while run.last_node != "dispatch_step":
        await asyncio.sleep(0.02)
    return task_id, run


async def test_running_zombie_stops_without_writing(running: RunningEngine, db_url: str) -> None:
    """A live run loses its lease mid-step: its next checkpoint is refused and it stops, and
    the loss is counted once (the heartbeat and the refused write may both find it)."""
    registry = running.engine.context.metrics.enable()  # the engine's own, off until now
    task_id, run = await started_mid_step(running)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(EXPIRE)
    claim = await workflow_rows.claim_for_resume(
        running.engine.pool,
        process=running.engine.settings.process,
        task_id=task_id,
        holder_id="usurper",
        ttl_seconds=60,
    )
    assert claim.lease is not None
    assert await running.engine.runs.wait(task_id, 10)
    assert run.outcome == "lease lost"
    record = await queries.get(running.engine.pool, task_id)
    assert record.last_node_id == "dispatch_step"  # collect_result's write never landed
    assert record.lease_holder_id == "usurper"
    lost = {"event": "lost"}
    assert registry.get_sample_value("workflow_engine_lease_events_total", lost) == 1


async def test_the_same_holder_retaking_its_lease_fences_out_its_older_run(
    pool: AsyncConnectionPool[Any], saver: RowCheckpointer, db_url: str
) -> None:
    """Holder A re-takes its own expired lease (a restarted runner with the same holder id): the
    new epoch is what counts, so A's older run can no longer write, renew, change the status or
    release, though holder and expiry match. Each clause of the fence is needed here: without
    the epoch, every one of these would land."""
    started = await create_as_a(pool)
    task_id = started.lease.task_id
    old = WriterContext(Fence(task_id, started.run_id, "A", started.lease.epoch))
    await put(saver, old, "written by A's first run")
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(EXPIRE)
    claim = await workflow_rows.claim_for_resume(
        pool, process="", task_id=task_id, holder_id="A", ttl_seconds=30
    )
    assert claim.lease is not None and claim.lease.epoch == started.lease.epoch + 1
    before = await queries.get(pool, task_id)

    old.node = "plan_steps"
    with pytest.raises(LeaseLost):
        await put(saver, old, "stale write by A's first run")
    async with pool.connection() as conn:
        assert await leases.renew(conn, old.fence, 3600) is None
    assert await workflow_rows.set_status(pool, old.fence, "FAILED", "stale failure") is False
    async with pool.connection() as conn:
        assert await leases.release(conn, old.fence) is False

    after = await queries.get(pool, task_id)
    assert after.state["summary"] == "written by A's first run"
    assert (after.status, after.error, after.last_node_id) == ("RUNNING", "", "load_task_context")
    assert after.lease_holder_id == "A"
    assert after.lease_expires_at == before.lease_expires_at  # not renewed by the old run
    assert after.updated_at == before.updated_at

    new = WriterContext(Fence(task_id, started.run_id, "A", claim.lease.epoch), node="plan_steps")
    await put(saver, new, "written by A's second run")
    assert await workflow_rows.set_status(pool, new.fence, "FAILED", "real failure") is True


async def test_a_live_run_is_fenced_out_when_its_own_holder_retakes_the_lease(
    running: RunningEngine,
) -> None:
    """The same holder id claims the task (a restarted runner would) while the old run of that
    holder is still alive and mid-step: the old run's next write is refused and it stops."""
    task_id, run = await started_mid_step(running)
    claim = await workflow_rows.claim_for_resume(
        running.engine.pool,
        process=running.engine.settings.process,
        task_id=task_id,
        holder_id=run.fence.holder_id,
        ttl_seconds=60,
    )
    assert claim.lease is not None and claim.lease.epoch > run.fence.epoch
    claimed = await queries.get(running.engine.pool, task_id)
    assert await running.engine.runs.wait(task_id, 10)
    assert run.outcome in ("lease lost", "stopped: lease lost")
    record = await queries.get(running.engine.pool, task_id)
    assert record.last_node_id == "dispatch_step"  # collect_result's write never landed
    assert record.event_seq == claimed.event_seq  # nor did anything after it
    assert record.status == "RUNNING"
