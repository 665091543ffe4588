"""The served peer (`benchmarks/served_peer.py`) keeps the contract it is measured on: what a
user would write instead of the engine is only a fair comparison if a client driving it gets
what the engine gives (every event in order, the outcome-only watch, the contract row), so
these tests drive it as `make bench` does, a real process on its own database, with a plain
client of the generated stubs."""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from psycopg.conninfo import make_conninfo

from tests.support.helpers import new_task_id, refusal, step, task, watch_until_end
from tests.support.processes import ChildProcess
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

PEER = Path(__file__).resolve().parents[2] / "benchmarks" / "served_peer.py"
pytestmark = pytest.mark.e2e

# The engine's nodes for three steps that pass, in the order it runs them.
THREE_STEPS = [
    "load_task_context",
    "plan_steps",
    *["dispatch_step", "collect_result", "verify_step_result"] * 3,
    "finalize_summary",
]


class PeerProcess(ChildProcess):
    """`served_peer.py` on a free port, as `compare.py` runs it (`ServedPeer.server_argv`)."""

    name = "served peer"

    def __init__(self, db_url: str) -> None:
        super().__init__()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.address = f"127.0.0.1:{probe.getsockname()[1]}"
        argv = [sys.executable, str(PEER), "--database-url", db_url, "--listen", self.address]
        self._spawn(argv, dict(os.environ))
        self._wait_serving(60)

    def _wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline and self.alive():
                try:
                    answer = health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                except grpc.RpcError:
                    time.sleep(0.1)
                    continue
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        self.kill()
        raise RuntimeError(f"the served peer did not start; its output: {self.logs[-20:]}")


@pytest.fixture(scope="module")
def peer_db(pg_server_url: str) -> Iterator[str]:
    """A fresh, empty database: the peer makes its own tables, as it does in `make bench`."""
    name = f"peer_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield make_conninfo(pg_server_url, dbname=name)
    with psycopg.connect(pg_server_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="module")
def peer(peer_db: str) -> Iterator[PeerProcess]:
    """One peer for the module's tests (each uses task ids of its own)."""
    process = PeerProcess(peer_db)
    yield process
    process.kill()


@pytest.fixture
async def stub(peer: PeerProcess) -> AsyncIterator[pb_grpc.WorkflowEngineStub]:
    async with grpc.aio.insecure_channel(peer.address) as channel:
        yield pb_grpc.WorkflowEngineStub(channel)


def start(task_id: str, *commands: str) -> pb.StartWorkflowRequest:
    steps = [step(f"s{i}", command) for i, command in enumerate(commands)]
    return pb.StartWorkflowRequest(task_id=task_id, task=task(*steps))


async def contract_row(db_url: str, task_id: str) -> tuple[str, dict[str, Any]]:
    """`last_node_id` and `state` of the task's `workflow_checkpoints` row."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT last_node_id, state FROM workflow_checkpoints WHERE task_id = %s", (task_id,)
        )
        row = await cur.fetchone()
    assert row is not None, "no contract row"
    return row[0], row[1]


def described(events: list[pb.WorkflowEvent]) -> list[tuple[int, str, str, str]]:
    return [
        (e.sequence, pb.EventKind.Name(e.kind), pb.WorkflowStatus.Name(e.status), e.node_id)
        for e in events
    ]


async def test_every_event_in_order_then_the_contract_row_and_no_second_start(
    stub: pb_grpc.WorkflowEngineStub, peer_db: str
) -> None:
    task_id = new_task_id()
    started = await stub.StartWorkflow(start(task_id, "true", "true", "true"))
    assert (started.status, started.workflow_status) == (pb.STARTED, pb.RUNNING)
    assert started.task_id == task_id and started.run_id

    events = await watch_until_end(stub, task_id)

    assert described(events) == [
        (1, "STATUS_CHANGED", "RUNNING", ""),
        *((n, "NODE_COMPLETED", "RUNNING", node) for n, node in enumerate(THREE_STEPS, 2)),
        (14, "STATUS_CHANGED", "SUCCEEDED", ""),
    ]
    assert {(e.task_id, e.run_id) for e in events} == {(task_id, started.run_id)}
    assert all(e.time.seconds > 0 for e in events)
    got = await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert (got.status, got.last_node_id, got.run_id) == (
        pb.SUCCEEDED,
        "finalize_summary",
        started.run_id,
    )
    last_node, state = await contract_row(peer_db, task_id)
    assert last_node == "finalize_summary"
    assert state["status"] == "succeeded" and state["current_step_index"] == 3
    assert state["results"] == [{"exit_code": 0}] * 3
    again = await stub.StartWorkflow(start(task_id, "true", "true", "true"))
    assert (again.status, again.workflow_status, again.run_id) == (
        pb.ALREADY_FINISHED,
        pb.SUCCEEDED,
        started.run_id,
    )


async def test_an_outcome_only_watch_gets_the_status_events_alone(
    stub: pb_grpc.WorkflowEngineStub,
) -> None:
    task_id = new_task_id()
    await stub.StartWorkflow(start(task_id, "true", "true", "true"))

    events = await watch_until_end(stub, task_id, kinds=[pb.STATUS_CHANGED])

    # Left-out events keep their sequence numbers: the stream has a gap.
    assert described(events) == [
        (1, "STATUS_CHANGED", "RUNNING", ""),
        (14, "STATUS_CHANGED", "SUCCEEDED", ""),
    ]


async def test_a_step_that_fails_ends_the_workflow_failed_through_mark_failed(
    stub: pb_grpc.WorkflowEngineStub, peer_db: str
) -> None:
    task_id = new_task_id()
    await stub.StartWorkflow(start(task_id, "true", "false", "true"))

    events = await watch_until_end(stub, task_id)

    nodes = [e.node_id for e in events if e.kind == pb.NODE_COMPLETED]
    assert nodes == [*THREE_STEPS[:8], "mark_failed"]
    assert (events[-1].kind, events[-1].status) == (pb.STATUS_CHANGED, pb.FAILED)
    got = await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert (got.status, got.last_node_id) == (pb.FAILED, "mark_failed")
    last_node, state = await contract_row(peer_db, task_id)
    assert (last_node, state["status"]) == ("mark_failed", "failed")
    assert state["results"] == [{"exit_code": 0}, {"exit_code": 1}]


async def test_an_unknown_task_is_not_found(stub: pb_grpc.WorkflowEngineStub) -> None:
    unknown = new_task_id()
    code, _ = await refusal(stub.GetWorkflow(pb.GetWorkflowRequest(task_id=unknown)))
    assert code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await watch_until_end(stub, unknown)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND


async def test_sigterm_ends_the_peer(peer_db: str) -> None:
    process = PeerProcess(peer_db)
    try:
        async with grpc.aio.insecure_channel(process.address) as channel:
            stub = pb_grpc.WorkflowEngineStub(channel)
            task_id = new_task_id()
            await stub.StartWorkflow(start(task_id, "true"))
            assert (await watch_until_end(stub, task_id))[-1].status == pb.SUCCEEDED
        # It stops serving and closes its pool on its own: a clean exit, not the signal's.
        assert process.terminate(timeout=5) == 0
    finally:
        process.kill()
