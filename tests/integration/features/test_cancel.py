"""CancelWorkflow is durable and prompt, stops the workflow's running jobs, and lets none start.

The jobs here are real processes under the local sandbox; each writes a file once it runs, and
the test finds its processes by what they run (`job_pids`) to see them go.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.integration.orchestrator import their_code
from tests.support.helpers import (
    job_pids,
    new_task_id,
    shell_step,
    task,
    unique_sleep,
    wait_for_status,
)
from workflow_engine.config import Settings
from workflow_engine.graph._nodes import job_id_for
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


async def wait_for_file(path: Path, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        await asyncio.sleep(0.05)
    return path.read_text()


async def wait_gone(pids: list[int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise AssertionError(f"still running: {[p for p in pids if alive(p)]}")
        await asyncio.sleep(0.05)


def job_result(settings: Settings, workflow: pb.Workflow, step_id: str) -> dict[str, object]:
    job_id = job_id_for(workflow.task_id, step_id, 1, workflow.run_id)
    path = settings.data_dir / "jobs" / job_id / "result.json"
    return json.loads(path.read_text())  # type: ignore[no-any-return]


STUBBORN = "trap '' TERM; echo $$ > {pid_file}; while :; do sleep 0.1; done"


async def start_one_step(stub: pb_grpc.WorkflowEngineStub, step_id: str, script: str) -> str:
    """Start a workflow of one shell step; return its task id."""
    task_id = new_task_id()
    await stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=task(shell_step(step_id, script)))
    )
    return task_id


async def cancel(running: RunningEngine, task_id: str) -> pb.Workflow:
    return await running.stub.CancelWorkflow(
        pb.CancelWorkflowRequest(task_id=task_id, reason="stop it"), timeout=2
    )


async def test_cancel_answers_at_once_and_kills_the_jobs_process_group(
    running: RunningEngine, settings: Settings, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    sleeper = unique_sleep(600)
    script = f"sleep {sleeper} & echo $$ $! > {pids}; wait"
    task_id = await start_one_step(running.stub, "long", script)
    await wait_for_file(pids)
    shell_and_child = sorted(set(job_pids(str(pids))) | set(job_pids(sleeper)))
    assert len(shell_and_child) == 2 and all(alive(pid) for pid in shell_and_child)

    wf = await cancel(running, task_id)  # a 2 s deadline: the answer does not wait for the job

    assert wf.status == pb.CANCELLED
    await wait_gone(shell_and_child)
    for _ in range(100):
        try:
            result = job_result(settings, wf, "long")
            break
        except FileNotFoundError:
            await asyncio.sleep(0.05)
    assert result["status"] == "cancelled", result["stderr"]
    assert not running.engine.runs.is_live(task_id)


async def test_a_job_that_ignores_sigterm_is_killed(
    running: RunningEngine, settings: Settings, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    script = STUBBORN.format(pid_file=pid_file)
    task_id = await start_one_step(running.stub, "stubborn", script)
    await wait_for_file(pid_file)
    pids = job_pids(str(pid_file))
    wf = await cancel(running, task_id)
    await wait_gone(pids)  # SIGKILL once the grace period is over
    await asyncio.sleep(0.5)
    assert job_result(settings, wf, "stubborn")["status"] == "cancelled"


@pytest.fixture
async def one_job_at_a_time(settings: Settings) -> AsyncIterator[RunningEngine]:
    replica = await start_engine(replace(settings, max_running_jobs=1))
    try:
        yield replica
    finally:
        await stop_engine(replica)


async def test_no_job_starts_after_the_workflow_is_cancelled(
    one_job_at_a_time: RunningEngine, tmp_path: Path
) -> None:
    """`second` is dispatched but waits for the only job slot, which `first` frees when it is
    killed: it must not start then, nor ever."""
    running = one_job_at_a_time
    first, second = tmp_path / "first", tmp_path / "second"
    spec = task(
        shell_step("first", f"echo $$ > {first}; sleep 3", depends_on=[]),
        shell_step("second", f"echo started > {second}", depends_on=[]),
        shell_step("join", "true", depends_on=["first", "second"]),
    )
    task_id = new_task_id()
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    await wait_for_file(first)
    pids = job_pids(str(first))
    wf = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert wf.state["steps"]["second"]["status"] == "dispatched"

    await cancel(running, task_id)
    await wait_gone(pids)
    await asyncio.sleep(4)  # longer than `first` would have run: its slot is long free
    assert not second.exists()


async def test_no_job_starts_after_the_orchestrator_took_the_lease(
    one_job_at_a_time: RunningEngine, db_url: str, tmp_path: Path
) -> None:
    """As above, but the lease is released and taken by the orchestrator's own code, which
    tells no engine: only the database, asked before the job starts, can say so."""
    running = one_job_at_a_time
    first, second = tmp_path / "first", tmp_path / "second"
    spec = task(
        shell_step("first", f"echo $$ > {first}; sleep 2", depends_on=[]),
        shell_step("second", f"echo started > {second}", depends_on=[]),
        shell_step("join", "true", depends_on=["first", "second"]),
    )
    task_id = new_task_id()
    started = await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    await wait_for_file(first)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await their_code.release(conn, task_id, started.lease_id)
        taken = await their_code.acquire(conn, task_id, "their-runner")
    assert taken.status == "started"
    await asyncio.sleep(4)  # `first` has ended and freed its slot long ago
    assert not second.exists()


async def test_drain_does_not_wait_for_cancelled_work(settings: Settings, tmp_path: Path) -> None:
    replica = await start_engine(replace(settings, drain_timeout_seconds=60))
    pid_file = tmp_path / "pid"
    script = STUBBORN.format(pid_file=pid_file)
    try:
        task_id = await start_one_step(replica.stub, "stubborn", script)
        await wait_for_file(pid_file)
        pids = job_pids(str(pid_file))
        await cancel(replica, task_id)
    finally:
        started = time.monotonic()
        await replica.channel.close()
        await replica.server.stop()  # the engine's own drain timeout: 60 s
        drained_in = time.monotonic() - started
    assert drained_in < 20, drained_in
    await wait_gone(pids)


async def test_a_cancel_on_another_replica_stops_the_job_where_it_runs(
    running: RunningEngine, second_replica: RunningEngine, tmp_path: Path
) -> None:
    """The run's lease is renewed only every 20 s here, so only the cancel's notification can
    stop it sooner."""
    pid_file = tmp_path / "pid"
    task_id = new_task_id()
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(
            task_id=task_id,
            task=task(shell_step("long", f"echo $$ > {pid_file}; sleep 600")),
            lease_ttl_seconds=60,
        )
    )
    await wait_for_file(pid_file)
    pids = job_pids(str(pid_file))
    await cancel(second_replica, task_id)
    await wait_gone(pids, timeout=8)
    for _ in range(100):
        if not running.engine.runs.is_live(task_id):
            break
        await asyncio.sleep(0.05)
    assert not running.engine.runs.is_live(task_id)
    done = await wait_for_status(running.stub, task_id)
    assert done.status == pb.CANCELLED


async def test_a_cancel_elsewhere_unheard_stops_the_jobs_at_the_runs_next_renewal(
    settings: Settings, tmp_path: Path
) -> None:
    """Without notifications (no listener), a cancel on another replica reaches the run when
    its lease renewal finds the lease gone: the run stops, and so do its jobs, named from the
    workflow's row (the run's end had already stopped waiting on them)."""
    deaf = replace(settings, listen_database_url="none")
    first = await start_engine(deaf)
    # A job directory of its own, as on another host: it cannot stop the job itself.
    second = await start_engine(
        replace(deaf, holder_id="test-engine-2", data_dir=tmp_path / "second")
    )
    try:
        pid_file = tmp_path / "pid"
        task_id = new_task_id()
        await first.stub.StartWorkflow(
            pb.StartWorkflowRequest(
                task_id=task_id,
                task=task(shell_step("long", f"echo $$ > {pid_file}; sleep 600")),
                lease_ttl_seconds=3,  # renewed every second
            )
        )
        await wait_for_file(pid_file)
        pids = job_pids(str(pid_file))
        await cancel(second, task_id)
        await wait_gone(pids, timeout=15)
        assert (await wait_for_status(first.stub, task_id)).status == pb.CANCELLED
    finally:
        for replica in (second, first):
            await stop_engine(replica)
