"""`workflow-engine serve` with two engine processes on one port, under one supervisor.

The engines hold leases under the one configured holder id, each lease naming its process, so
the orchestrator's own statements see the holder it configured; connections spread across
them; a watch of a workflow both wrote gets every event at once from either; a killed engine
is replaced and its workflows adopted with nothing run twice; SIGTERM drains them all; a killed
supervisor leaves no engine behind.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import psycopg
import pytest

from tests.integration.orchestrator import their_code
from tests.support.engine_process import EngineProcess
from tests.support.helpers import (
    new_task_id,
    open_to_jobs,
    shell_step,
    step,
    task,
    wait_for_status,
    watch_until_end,
)
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

TWO = {"WORKFLOW_ENGINE_PROCESSES": "2"}


@asynccontextmanager
async def connections(address: str, n: int) -> AsyncIterator[list[pb_grpc.WorkflowEngineStub]]:
    """`n` clients, each on a connection of its own (gRPC shares them between channels unless
    told not to), so the kernel can send each to either engine."""
    channels = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(n)
    ]
    try:
        yield [pb_grpc.WorkflowEngineStub(c) for c in channels]
    finally:
        for channel in channels:
            await channel.close()


def engine_pids(supervisor: EngineProcess) -> list[int]:
    return [int(pid) for pid in supervisor.wait_for_log("serving")["pids"]]  # type: ignore[union-attr]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def holders(db_url: str) -> set[tuple[str, str]]:
    """The (holder, engine process) of every live lease."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT DISTINCT holder_id, holder_process FROM task_workflow_leases"
            " WHERE holder_id IS NOT NULL"
        )
        return {(row[0], row[1]) for row in await cur.fetchall()}


async def process_of(db_url: str, task_id: str) -> str:
    """The engine process that took the task's lease last."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT holder_process FROM task_workflow_leases WHERE task_id = %s", (task_id,)
        )
        row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def one_stub_per_process(
    stubs: list[pb_grpc.WorkflowEngineStub], db_url: str
) -> list[pb_grpc.WorkflowEngineStub]:
    """A stub whose connection reaches engine process 1, and one reaching process 2 (each
    found by the process a quick workflow started through it ran in)."""
    found: dict[str, pb_grpc.WorkflowEngineStub] = {}
    for stub in stubs:
        probe = new_task_id()
        await stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=probe, task=task(step("p", "true")))
        )
        found.setdefault(await process_of(db_url, probe), stub)
    assert sorted(found) == ["pair/1", "pair/2"], f"the connections reached only {found}"
    return [found["pair/1"], found["pair/2"]]


async def test_two_engines_share_the_port_and_the_configured_holder_id(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    supervisor = EngineProcess(
        db_url=db_url, data_dir=tmp_path / "data", holder_id="pair", extra_env=TWO
    )
    processes.append(supervisor)
    assert len(engine_pids(supervisor)) == 2
    spec = task(shell_step("wait", "sleep 2"), shell_step("done", "true"))
    async with connections(supervisor.address, 12) as stubs:
        ids = [new_task_id() for _ in stubs]
        for stub, task_id in zip(stubs, ids, strict=True):
            await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        assert await holders(db_url) == {("pair", "pair/1"), ("pair", "pair/2")}
        ends = await asyncio.gather(
            *(watch_until_end(stub, t) for stub, t in zip(stubs, ids, strict=True))
        )
    assert all(events[-1].status == pb.SUCCEEDED for events in ends)


async def test_the_orchestrators_own_start_sees_the_holder_it_configured(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    # The orchestrator configured the engine as "pair" and started through it with its lease
    # id as the idempotency key: its own acquire (read, then write) must answer
    # already_running for "pair", whichever engine process runs the workflow; and a resume
    # reaching the other process must not take the live run from its sibling.
    supervisor = EngineProcess(
        db_url=db_url, data_dir=tmp_path / "data", holder_id="pair", extra_env=TWO
    )
    processes.append(supervisor)
    async with connections(supervisor.address, 12) as stubs:
        first, second = await one_stub_per_process(stubs, db_url)
        task_id, lease_id = new_task_id(), str(uuid.uuid4())
        spec = task(shell_step("wait", "sleep 5"))
        started = await first.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, idempotency_key=lease_id, task=spec)
        )
        assert (started.status, started.holder_id, started.lease_id) == (
            pb.STARTED,
            "pair",
            lease_id,
        )
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            theirs = await their_code.acquire(conn, task_id, "pair", lease_id)
            assert theirs.status == "already_running"
            other = await their_code.acquire(conn, task_id, "someone-else")
            assert other.status == "conflict"
        again = await second.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, idempotency_key=lease_id, task=spec)
        )
        assert again.status == pb.ALREADY_RUNNING
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await second.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=task_id))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "holder 'pair' (engine process 'pair/1')" in (refused.value.details() or "")
        assert await process_of(db_url, task_id) == "pair/1"
        events = await watch_until_end(second, task_id, timeout=30)
    assert events[-1].status == pb.SUCCEEDED
    assert {e.run_id for e in events} == {started.run_id}


async def test_a_workflow_both_engines_wrote_is_watched_whole_from_either_at_once(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    # Paused in one engine, approved and finished in the other (or cancelled by the other):
    # 50 watches through each engine get every event, in order, long before a 60 s poll.
    supervisor = EngineProcess(
        db_url=db_url,
        data_dir=tmp_path / "data",
        holder_id="pair",
        extra_env={**TWO, "WORKFLOW_ENGINE_WATCH_POLL_SECONDS": "60"},
    )
    processes.append(supervisor)
    async with connections(supervisor.address, 12) as stubs:
        first, second = await one_stub_per_process(stubs, db_url)
        approved = new_task_id()
        spec = task(step("a", "true"), step("b", "true", requires_approval=True))
        await first.StartWorkflow(pb.StartWorkflowRequest(task_id=approved, task=spec))
        await wait_for_status(first, approved, {pb.WAITING_FOR_APPROVAL})
        decision = pb.ApprovalDecision(step_id="b", verdict=pb.APPROVE)
        await second.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=approved, decision=decision))
        await wait_for_status(second, approved, {pb.SUCCEEDED})
        assert await process_of(db_url, approved) == "pair/2"

        cancelled = new_task_id()
        spec = task(step("quick", "true"), shell_step("long", "sleep 30"))
        await first.StartWorkflow(pb.StartWorkflowRequest(task_id=cancelled, task=spec))
        await asyncio.sleep(0.5)  # into the long step
        await second.CancelWorkflow(pb.CancelWorkflowRequest(task_id=cancelled))

        for task_id in (approved, cancelled):
            history = list(
                (await second.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))).history
            )
            assert history[-1].status in (pb.SUCCEEDED, pb.CANCELLED)
            for stub in (first, second):
                for _ in range(50):
                    watched = await watch_until_end(stub, task_id, from_sequence=1, timeout=2)
                    assert watched == history


async def test_sigterm_drains_every_engine_and_the_supervisor_exits_0(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    supervisor = EngineProcess(
        db_url=db_url, data_dir=tmp_path / "data", holder_id="pair", extra_env=TWO
    )
    processes.append(supervisor)
    pids = engine_pids(supervisor)
    spec = task(shell_step("wait", "sleep 3"), shell_step("done", "true"))
    async with connections(supervisor.address, 8) as stubs:
        for stub in stubs:
            await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=new_task_id(), task=spec))
    assert len(await holders(db_url)) == 2
    assert supervisor.terminate(timeout=60) == 0
    assert not any(alive(pid) for pid in pids)
    assert supervisor.count("drain_finished") == 2
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE holder_id IS NULL AND handed_over), count(*)"
            " FROM task_workflow_leases"
        )
        handed_over, leases = await cur.fetchone()  # type: ignore[misc]
    assert handed_over == leases == 8  # every run stopped at a node boundary, lease handed on


async def test_a_killed_engine_is_replaced_and_its_workflows_adopted_each_step_once(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    supervisor = EngineProcess(
        db_url=db_url, data_dir=tmp_path / "data", holder_id="pair", ttl=3, extra_env=TWO
    )
    processes.append(supervisor)
    victim = engine_pids(supervisor)[0]
    marks = open_to_jobs(tmp_path / "marks")
    async with connections(supervisor.address, 8) as stubs:
        ids = [new_task_id() for _ in stubs]
        for stub, task_id in zip(stubs, ids, strict=True):
            spec = task(
                *(shell_step(f"s{i}", f"echo x >> {marks}/{task_id}-{i}; sleep 1") for i in (1, 2))
            )
            await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        await asyncio.sleep(0.5)  # every first step is running
        os.kill(victim, 9)
        supervisor.wait_for_log("engine_process_restarted", timeout=30)
        deadline = time.monotonic() + 60
        statuses: list[int] = []
        while time.monotonic() < deadline:
            statuses = [
                (await stubs[0].GetWorkflow(pb.GetWorkflowRequest(task_id=t))).status for t in ids
            ]
            if all(s == pb.SUCCEEDED for s in statuses):
                break
            await asyncio.sleep(0.2)
    assert all(s == pb.SUCCEEDED for s in statuses), statuses
    assert supervisor.count("engine_process_exited") == 1
    for task_id in ids:  # each step's side effect once, the interrupted ones included
        assert [(marks / f"{task_id}-{i}").read_text() for i in (1, 2)] == ["x\n", "x\n"]


async def test_a_killed_supervisor_leaves_no_engine_behind(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    supervisor = EngineProcess(
        db_url=db_url, data_dir=tmp_path / "data", holder_id="pair", extra_env=TWO
    )
    processes.append(supervisor)
    pids = engine_pids(supervisor)
    supervisor.kill()
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, "an engine outlived its supervisor"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("second", ["1", "2"])
def test_a_second_serve_on_the_same_port_is_refused(
    db_url: str, tmp_path: Path, processes: list[EngineProcess], second: str
) -> None:
    # The engines of one supervisor share their port (SO_REUSEPORT); a second supervisor, or a
    # lone engine, started on it by mistake would otherwise be handed some of its connections.
    first = EngineProcess(
        db_url=db_url, data_dir=tmp_path / "first", holder_id="first", extra_env=TWO
    )
    processes.append(first)
    engine_pids(first)
    other = EngineProcess(
        db_url=db_url,
        data_dir=tmp_path / "second",
        holder_id="second",
        extra_env={"WORKFLOW_ENGINE_PROCESSES": second, "WORKFLOW_ENGINE_LISTEN": first.address},
        wait_serving=False,
    )
    processes.append(other)
    assert other.proc.wait(60) == 2
    other.wait_for_raw(f"WORKFLOW_ENGINE_LISTEN: cannot listen on {first.address}")
    assert other.count("serving") == 0
    assert first.alive()


@pytest.mark.parametrize("processes_setting", ["1", "2"])
def test_sigterm_during_start_up_stops_at_once(
    tmp_path: Path, processes: list[EngineProcess], processes_setting: str
) -> None:
    # A database that is not there (yet): the start-up waits for it, up to 30 s, and a SIGTERM
    # meanwhile (a rollout cancelled, a container stopped) ends the process now and cleanly.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    engine = EngineProcess(
        db_url=f"postgresql://nobody@127.0.0.1:{port}/none",
        data_dir=tmp_path / "data",
        holder_id="early",
        extra_env={"WORKFLOW_ENGINE_PROCESSES": processes_setting},
        wait_serving=False,
    )
    processes.append(engine)
    engine.wait_for_raw("error connecting")
    assert engine.terminate(timeout=10) == 0
    assert engine.count("stopped") == 1
