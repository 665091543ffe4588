"""Nothing of an ended workflow stays in an engine's memory (issue 62).

Workflows end every way (succeeded, failed, cancelled from the other replica, waited for
approval and resumed by the other replica, watched to their end) across two replicas; then
each replica's census (`Engine.held`, `domain.held`) counts what its id-keyed structures hold:
none of the structures whose entries end with their workflows holds any, and no cache holds
more than its bound. In-process with two `Engine`s, and served: `workflow-engine serve` with
two engine processes, counted through ``workflow_engine_held_entries``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.e2e.test_processes import connections, one_stub_per_process
from tests.e2e.test_telemetry import METRICS_ON, scrape
from tests.support.engine_process import EngineProcess
from tests.support.helpers import (
    new_task_id,
    shell_step,
    step,
    task,
    wait_for_status,
    watch_until_end,
)
from workflow_engine.config import Settings
from workflow_engine.domain.held import Held
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

#: How many workflows of each ending.
EACH = 4
Stub = pb_grpc.WorkflowEngineStub


async def end_every_way(first: Stub, second: Stub) -> None:
    """Workflows started through `first` that end every way, some through `second`."""

    async def started(spec: pb.TaskSpec) -> str:
        task_id = new_task_id()
        await first.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        return task_id

    ended: list[str] = []
    for _ in range(EACH):
        succeeded = await started(task(step("a", "true"), step("b", "true"), step("c", "true")))
        watched = asyncio.create_task(watch_until_end(first, succeeded, from_sequence=1))
        failed = await started(task(step("a", "true"), step("b", "false")))
        approved = await started(task(step("a", "true"), step("b", "true", requires_approval=True)))
        cancelled = await started(task(step("quick", "true"), shell_step("long", "sleep 60")))
        await wait_for_status(first, approved, {pb.WAITING_FOR_APPROVAL})
        decision = pb.ApprovalDecision(step_id="b", verdict=pb.APPROVE)
        await second.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=approved, decision=decision))
        await wait_for_status(first, cancelled, {pb.RUNNING})
        await asyncio.sleep(0.3)  # into its long step
        await second.CancelWorkflow(pb.CancelWorkflowRequest(task_id=cancelled))
        assert (await watched)[-1].status == pb.SUCCEEDED
        ended += [succeeded, failed, approved, cancelled]
    for task_id in ended:
        await wait_for_status(second, task_id)


async def until_nothing_over(census: Callable[[], Awaitable[list[Held]]]) -> list[Held]:
    """What is held beyond its bound once what ends has had up to 30 s to end (jobs being
    killed, watches closing); [] when nothing is."""
    deadline = time.monotonic() + 30
    while True:
        over = [held for held in await census() if held.over]
        if not over or time.monotonic() > deadline:
            return over
        await asyncio.sleep(0.2)


async def test_an_engine_holds_nothing_of_its_ended_workflows(settings: Settings) -> None:
    replicas: list[RunningEngine] = []
    try:
        for _ in range(2):
            replicas.append(await start_engine(settings))
        first, second = replicas
        await end_every_way(first.stub, second.stub)
        for replica in replicas:

            async def census(engine: RunningEngine = replica) -> list[Held]:
                return engine.engine.held()

            assert await until_nothing_over(census) == []
            structures = {held.structure for held in replica.engine.held()}
            assert {"runs.live", "jobs.tasks", "events.feeds", "claims.locks"} <= structures
    finally:
        for replica in replicas:
            await stop_engine(replica)


async def test_a_served_engine_holds_nothing_of_its_ended_workflows(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    supervisor = EngineProcess(
        db_url=db_url,
        data_dir=tmp_path / "data",
        holder_id="pair",
        extra_env={
            **METRICS_ON,
            "WORKFLOW_ENGINE_PROCESSES": "2",
            "WORKFLOW_ENGINE_TIMER_INTERVAL_SECONDS": "0.2",
        },
    )
    processes.append(supervisor)
    async with connections(supervisor.address, 12) as stubs:
        first, second = await one_stub_per_process(stubs, db_url)
        await end_every_way(first, second)

    async def census() -> list[Held]:
        samples = await asyncio.to_thread(scrape, supervisor)
        return [
            Held(labels["structure"], int(entries), int(labels["bound"]))
            for (name, pairs), entries in samples.items()
            if name == "workflow_engine_held_entries"
            for labels in [dict(pairs)]
        ]

    assert await until_nothing_over(census) == []
    assert "events.feeds" in {held.structure for held in await census()}


async def test_the_census_counts_a_live_workflow(settings: Settings) -> None:
    """The census is not blind: while a workflow runs, its run, job and feed are counted."""
    running = await start_engine(settings)
    try:
        task_id = new_task_id()
        await running.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=task(shell_step("long", "sleep 60")))
        )
        await wait_for_status(running.stub, task_id, {pb.RUNNING})
        counted: dict[str, int] = {}
        for _ in range(100):
            counted = {held.structure: held.entries for held in running.engine.held()}
            if counted["jobs.tasks"] or counted["jobs.workflows"]:
                break
            await asyncio.sleep(0.1)
        assert counted["runs.live"] == 1
        assert counted["jobs.workflows"] == 1
        assert counted["events.feeds"] == 1
        await running.stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=task_id))
        await wait_for_status(running.stub, task_id)

        async def census() -> list[Held]:
            return running.engine.held()

        assert await until_nothing_over(census) == []
    except grpc.aio.AioRpcError as exc:
        pytest.fail(f"refused: {exc.code()} {exc.details()}")
    finally:
        await stop_engine(running)
