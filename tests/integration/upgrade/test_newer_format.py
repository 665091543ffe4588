"""A rolling deploy: this engine meets rows a newer engine wrote, and leaves them exactly alone.

The newer engine is played by SQL: it rewrites a workflow's row in a state format one past this
engine's (with its own key in the state, its version, and one more event, as an engine's write
does, so the row is not taken for another writer's). Then every call and sweep that could
change the row is made, and the tables must be byte for byte as they were: no claim, no status,
no block, no event, no lease taken. Each refusal is `FAILED_PRECONDITION` and says which engine
and format wrote the row; `GetWorkflow` says the same as the row's `blocked_reason`.

Each case has a control: the same change to a row of this engine's own format is made, and
must act, so the case cannot pass because nothing ran.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import psycopg
import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.helpers import new_task_id, snapshot, step, task, wait_for_status
from workflow_engine.config import Settings
from workflow_engine.domain.state_format import STATE_FORMAT
from workflow_engine.storage import workflow_rows
from workflow_engine.v1 import workflow_engine_pb2 as pb

NEWER = STATE_FORMAT + 1
NEWER_ENGINE = "9.0.0"
SAYS = (f"engine {NEWER_ENGINE}", f"state format {NEWER}", f"to {STATE_FORMAT}")

# What a newer engine's write looks like: its state (one key this engine has never seen), its
# format and version, and one more event (its writes append events, as this engine's do).
_WRITE_AS_NEWER = """
UPDATE workflow_checkpoints
   SET state = state || '{"written_by_newer": {"form": "unknown here"}}',
       state_format = %(format)s, engine_version = %(version)s,
       event_seq = event_seq + 1, updated_at = now()
 WHERE task_id = %(task_id)s
"""


async def waiting(engine: RunningEngine) -> str:
    """A workflow of this engine waiting for approval of its step ``ship``."""
    task_id = new_task_id()
    await engine.stub.StartWorkflow(
        pb.StartWorkflowRequest(
            task_id=task_id, task=task(step("ship", "true", requires_approval=True))
        )
    )
    await wait_for_status(engine.stub, task_id, {pb.WAITING_FOR_APPROVAL})
    return task_id


async def sql(db_url: str, statement: str, task_id: str, **params: object) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(statement, {"task_id": task_id, **params})


async def as_newer(db_url: str, task_id: str, state_format: int = NEWER) -> None:
    await sql(db_url, _WRITE_AS_NEWER, task_id, format=state_format, version=NEWER_ENGINE)


def refused(error: grpc.aio.AioRpcError) -> None:
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error
    for words in SAYS:
        assert words in (error.details() or ""), error.details()


CALLS = {
    "decision": lambda task_id: pb.ResumeWorkflowRequest(
        task_id=task_id, decision=pb.ApprovalDecision(step_id="ship", verdict=pb.APPROVE)
    ),
    "resume": lambda task_id: pb.ResumeWorkflowRequest(task_id=task_id),
    "override": lambda task_id: pb.UpdateWorkflowRequest(
        task_id=task_id, operator="op", reason="r", force_branch=pb.MARK_FAILED
    ),
    "cancel": lambda task_id: pb.CancelWorkflowRequest(task_id=task_id, reason="stop"),
    "start": lambda task_id: pb.StartWorkflowRequest(
        task_id=task_id, task=task(step("ship", "true", requires_approval=True))
    ),
}


async def call(engine: RunningEngine, name: str, task_id: str) -> object:
    request = CALLS[name](task_id)
    method = {
        "decision": engine.stub.ResumeWorkflow,
        "resume": engine.stub.ResumeWorkflow,
        "override": engine.stub.UpdateWorkflow,
        "cancel": engine.stub.CancelWorkflow,
        "start": engine.stub.StartWorkflow,
    }[name]
    return await method(request)  # type: ignore[operator]


@pytest.mark.parametrize("name", list(CALLS))
async def test_a_call_that_would_change_a_newer_row_is_refused_and_changes_nothing(
    running: RunningEngine, db_url: str, name: str
) -> None:
    task_id = await waiting(running)
    await as_newer(db_url, task_id)
    before = await snapshot(db_url)

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(running, name, task_id)
    refused(caught.value)
    shown = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    for words in SAYS:
        assert words in shown.blocked_reason
    await asyncio.sleep(1)  # three recovery sweeps
    assert await snapshot(db_url) == before


async def test_the_same_calls_act_on_a_row_of_this_engines_format(
    running: RunningEngine, db_url: str
) -> None:
    """The control: each call above changes a row this engine reads (a start is refused as
    the workflow exists, not for its format)."""
    for name in ("decision", "override", "cancel"):
        task_id = await waiting(running)
        await as_newer(db_url, task_id, state_format=STATE_FORMAT)
        before = await snapshot(db_url)
        await call(running, name, task_id)
        await wait_for_status(running.stub, task_id, {pb.SUCCEEDED, pb.FAILED, pb.CANCELLED})
        assert await snapshot(db_url) != before
    task_id = await waiting(running)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(running, "start", task_id)
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_recovery_never_adopts_a_newer_row_and_counts_it(
    settings: Settings, db_url: str
) -> None:
    """Two workflows mid-job on a replica that drains (it hands their leases over, RUNNING);
    a newer engine rewrites one. The replica that comes up adopts the other one only."""
    first = await start_engine(replace(settings, recovery_enabled=False, drain_timeout_seconds=0))
    newer, ours = new_task_id(), new_task_id()
    for task_id in (newer, ours):
        await first.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=task(step("wait", "sleep", "30")))
        )
    await asyncio.sleep(1)
    await stop_engine(first)
    await as_newer(db_url, newer)
    before = await snapshot(db_url)

    second = await start_engine(replace(settings, holder_id="second"))
    try:
        registry = second.engine.context.metrics.enable()
        deadline = asyncio.get_running_loop().time() + 10
        while (
            await second.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=ours))
        ).lease_holder_id != "second":
            assert asyncio.get_running_loop().time() < deadline, "the control was not adopted"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1)  # three more sweeps
        after = await snapshot(db_url)
        assert rows_of(after, newer) == rows_of(before, newer)
        assert rows_of(after, ours) != rows_of(before, ours)
        assert registry.get_sample_value("workflow_engine_unreadable_workflows") == 1
        assert await workflow_rows.count_unreadable(second.engine.pool) == 1
        await second.stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=ours, reason="done"))
    finally:
        await stop_engine(second)


def rows_of(snap: dict[str, list[object]], task_id: str) -> list[object]:
    return [row for rows in snap.values() for row in rows if task_id in str(row)]


async def test_a_row_of_a_format_older_than_any_this_engine_reads_is_left_alone_too(
    running: RunningEngine, db_url: str
) -> None:
    task_id = await waiting(running)
    await as_newer(db_url, task_id, state_format=0)
    before = await snapshot(db_url)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call(running, "decision", task_id)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "state format 0" in (caught.value.details() or "")
    assert await snapshot(db_url) == before


async def test_rows_this_engine_writes_record_its_format_and_version(
    running: RunningEngine, db_url: str
) -> None:
    from workflow_engine import __version__

    task_id = await waiting(running)
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT state_format, engine_version FROM workflow_checkpoints WHERE task_id = %s",
            (task_id,),
        )
        assert await cur.fetchone() == (STATE_FORMAT, __version__)
