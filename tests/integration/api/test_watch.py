"""WatchWorkflow: served from the process's own writes, from the table for everything else.

A watcher of a workflow running in the same process gets its events from that process's event
feed; the table is read for a workflow running elsewhere, for a watcher catching up from an old
sequence, and for events another writer appended (a cancel in another replica). Every stream
must equal the stored history, event for event.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import psycopg
import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.helpers import (
    new_task_id,
    shell_step,
    step,
    task,
    wait_for_status,
    watch_until_end,
)
from workflow_engine.config import LISTEN_NONE, Settings
from workflow_engine.runtime._events import FEED_EVENTS
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc


async def _history(stub: pb_grpc.WorkflowEngineStub, task_id: str) -> list[pb.WorkflowEvent]:
    wf = await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    return list(wf.history)


async def _event_table_reads(db_url: str) -> int:
    """How often anyone read `workflow_events`, by PostgreSQL's own statistics.

    Every other connection to the database is ended first (a pooler keeps server connections
    open): a backend hands its statistics over when it exits.
    """
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        others = (
            "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        await conn.execute(f"SELECT pg_terminate_backend(pid) {others}")
        for _ in range(100):
            cur = await conn.execute(f"SELECT count(*) {others}")
            row = await cur.fetchone()
            if row is not None and row[0] == 0:
                break
            await asyncio.sleep(0.05)
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        cur = await conn.execute(
            "SELECT seq_scan + coalesce(idx_scan, 0) FROM pg_stat_user_tables"
            " WHERE relname = 'workflow_events'"
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_a_local_run_is_watched_without_reading_the_table_and_a_remote_one_with(
    settings: Settings, db_url: str
) -> None:
    spec = task(step("a", "true"), step("b", "true"), step("c", "true"))
    first = await start_engine(settings)
    try:
        local = new_task_id()
        await first.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=local, task=spec))
        watched = await watch_until_end(first.stub, local, from_sequence=1)
    finally:
        await stop_engine(first)
    assert watched[-1].status == pb.SUCCEEDED
    reads_local = await _event_table_reads(db_url)

    runner = await start_engine(settings)
    elsewhere = await start_engine(replace(settings, holder_id="test-engine-2"))
    try:
        remote = new_task_id()
        await runner.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=remote, task=spec))
        watched_remote = await watch_until_end(elsewhere.stub, remote, from_sequence=1)
    finally:
        await stop_engine(elsewhere)
        await stop_engine(runner)
    reads_remote = await _event_table_reads(db_url) - reads_local

    assert reads_local == 0, f"the local watcher read workflow_events {reads_local} times"
    assert reads_remote >= 2, "the control: a remote watcher must read the table"
    assert [e.sequence for e in watched_remote][-1] == watched[-1].sequence


async def test_every_watch_equals_the_stored_history(running: RunningEngine) -> None:
    # More events than a feed holds: a watcher from sequence 1 catches up from the table,
    # then follows the feed; one from a recent sequence is served from the feed alone.
    steps = [step(f"s{i}", "true") for i in range(FEED_EVENTS // 3 + 4)]
    task_id = new_task_id()
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=task(*steps)))
    streamed = await watch_until_end(running.stub, task_id, from_sequence=1)
    history = await _history(running.stub, task_id)
    assert streamed == history
    assert [e.sequence for e in history] == list(range(1, len(history) + 1))
    assert len(history) > FEED_EVENTS

    for start in (1, len(history) - 5, len(history)):
        again = await watch_until_end(running.stub, task_id, from_sequence=start)
        assert again == history[start - 1 :]


async def test_a_watcher_here_sees_a_cancel_made_in_another_replica_at_once(
    settings: Settings,
) -> None:
    # A poll far longer than the test's patience: only the notification can end the stream.
    slow_poll = replace(settings, watch_poll_seconds=60)
    runner = await start_engine(slow_poll)
    other = await start_engine(replace(slow_poll, holder_id="test-engine-2"))
    try:
        task_id = new_task_id()
        spec = task(step("quick", "true"), shell_step("long", "sleep 30"))
        await runner.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        watch = asyncio.create_task(watch_until_end(runner.stub, task_id, timeout=15))
        await wait_for_status(runner.stub, task_id, {pb.RUNNING})
        await asyncio.sleep(0.5)  # the watcher is following the run's own writes by now
        await other.stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=task_id, reason="stop"))
        events = await watch
        assert events[-1].status == pb.CANCELLED
        assert events == await _history(runner.stub, task_id)
    finally:
        await stop_engine(other)
        await stop_engine(runner)


async def test_a_watch_for_some_kinds_gets_those_and_the_end(running: RunningEngine) -> None:
    # A step that fails its check once: node events, status changes and a retry between them.
    spec = task(step("a", "true"), shell_step("b", "exit 3"))
    spec.max_attempts_per_step = 2
    task_id = new_task_id()
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    statuses = await watch_until_end(running.stub, task_id, kinds=[pb.STATUS_CHANGED])
    history = await _history(running.stub, task_id)
    assert history[-1].status == pb.FAILED
    assert statuses == [e for e in history if e.kind == pb.STATUS_CHANGED]
    # Nodes only: the terminal status change still ends the stream, and is sent.
    nodes = await watch_until_end(running.stub, task_id, from_sequence=1, kinds=[pb.NODE_COMPLETED])
    assert nodes == [e for e in history if e.kind == pb.NODE_COMPLETED] + [history[-1]]
    assert len(nodes) > 3
    both = await watch_until_end(
        running.stub, task_id, from_sequence=2, kinds=[pb.NODE_COMPLETED, pb.STATUS_CHANGED]
    )
    assert both == history[1:]


async def _watched_quickly(
    stubs: list[pb_grpc.WorkflowEngineStub], task_id: str, history: list[pb.WorkflowEvent]
) -> None:
    """50 watches from each stub get every event in order, each well within the poll interval
    (the engines poll every 60 s: a watch that waits for a poll times out here)."""
    for stub in stubs:
        for _ in range(50):
            assert await watch_until_end(stub, task_id, from_sequence=1, timeout=2) == history


@pytest.mark.parametrize("notifications", ["on", "off"])
async def test_a_workflow_two_replicas_wrote_is_watched_whole_from_either_at_once(
    settings: Settings, notifications: str
) -> None:
    # One replica runs the first step and pauses for approval; the other takes the decision and
    # finishes it. The first one's feed still holds what it wrote, which is not the end; with
    # notifications off nothing tells it so, and the watch must not trust it anyway.
    slow_poll = replace(settings, watch_poll_seconds=60)
    if notifications == "off":
        slow_poll = replace(slow_poll, listen_database_url=LISTEN_NONE)
    first = await start_engine(slow_poll)
    other = await start_engine(replace(slow_poll, holder_id="test-engine-2"))
    try:
        task_id = new_task_id()
        spec = task(step("a", "true"), step("b", "true", requires_approval=True))
        await first.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        await wait_for_status(first.stub, task_id, {pb.WAITING_FOR_APPROVAL})
        decision = pb.ApprovalDecision(step_id="b", verdict=pb.APPROVE)
        await other.stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(task_id=task_id, decision=decision)
        )
        await wait_for_status(other.stub, task_id, {pb.SUCCEEDED})
        history = await _history(other.stub, task_id)
        assert {e.run_id for e in history} and history[-1].status == pb.SUCCEEDED
        await _watched_quickly([first.stub, other.stub], task_id, history)
        if notifications == "off":
            return  # a cancel elsewhere reaches a live run here at its next lease renewal

        cancelled = new_task_id()
        spec = task(step("quick", "true"), shell_step("long", "sleep 30"))
        await first.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=cancelled, task=spec))
        await wait_for_status(first.stub, cancelled, {pb.RUNNING})
        await asyncio.sleep(0.3)  # into the long step
        await other.stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=cancelled))
        history = await _history(other.stub, cancelled)
        assert history[-1].status == pb.CANCELLED
        await _watched_quickly([first.stub, other.stub], cancelled, history)
    finally:
        await stop_engine(other)
        await stop_engine(first)


async def test_a_run_resumed_here_does_not_serve_an_older_feed_of_its_workflow(
    settings: Settings,
) -> None:
    # Notifications off: nothing tells this replica what the other one wrote. It ran the first
    # step, the other ran the second and started the third's job, then stopped mid-job; this
    # replica's recovery adopts the workflow and waits for the job. Its feed still holds its
    # own first events; a watch must get everything in the table now, not wait for the job.
    quiet = replace(settings, watch_poll_seconds=60, listen_database_url=LISTEN_NONE)
    here = await start_engine(replace(quiet, recovery_interval_seconds=60))
    other = await start_engine(replace(quiet, holder_id="test-engine-2"))
    task_id = new_task_id()
    try:
        spec = task(
            step("a", "true"),
            step("b", "true", requires_approval=True),
            shell_step("c", "sleep 4"),
        )
        await here.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        await wait_for_status(here.stub, task_id, {pb.WAITING_FOR_APPROVAL})
        decision = pb.ApprovalDecision(step_id="b", verdict=pb.APPROVE)
        await other.stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(task_id=task_id, decision=decision)
        )
        for _ in range(100):
            wf = await other.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
            if wf.state["current_step_index"] == 2 and wf.last_node_id == "dispatch_step":
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the third step's job never started")
    finally:
        await other.server.stop(drain_timeout=0.1)  # abandons the job's node, hands it over
        await other.channel.close()
    try:
        assert await here.engine.service.recover(task_id)
        in_table = await _history(here.stub, task_id)
        call = here.stub.WatchWorkflow(pb.WatchWorkflowRequest(task_id=task_id, from_sequence=1))
        streamed = []
        async with asyncio.timeout(2):
            async for event in call:
                streamed.append(event)
                if len(streamed) == len(in_table):
                    break
        call.cancel()
        assert streamed == in_table
        assert (await watch_until_end(here.stub, task_id, timeout=30))[-1].status == pb.SUCCEEDED
    finally:
        await stop_engine(here)
