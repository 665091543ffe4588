"""One tenant cannot take every slot (issue 48, finding 12).

The attacker is a tenant (a caller scoped to project-a) that floods the engine: many long
jobs, many workflows, many watch streams. Its jobs may take every free slot, but a slot that
frees while another tenant's job waits goes to that job: project-b's next job waits for one
slot at most. Its workflows and its watches are capped by settings, and one more is refused
with RESOURCE_EXHAUSTED naming the setting, with nothing stored.

The jobs are real processes under the local sandbox, each held by a gate file the test
creates; each writes its name to a shared file when it starts, and the test compares orders
of starts, not times.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.security.conftest import as_caller, tenant_task
from tests.support.helpers import (
    TERMINAL,
    new_task_id,
    shell_step,
    snapshot,
    step,
    wait_for_status,
)
from workflow_engine.config import Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb


@asynccontextmanager
async def serving(secured: Settings, **overrides: Any) -> AsyncIterator[RunningEngine]:
    """The `served` engine with `overrides` to its settings."""
    running = await start_engine(replace(secured, **overrides))
    try:
        yield running
    finally:
        await stop_engine(running)


async def until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Wait until `condition()` holds (checked every 20 ms), or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"still not: {what}")
        await asyncio.sleep(0.02)


class Gates:
    """Jobs that say when they start (a line in `starts`) and run until their gate opens."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self.starts = where / "starts"
        self.starts.touch()
        self.starts.chmod(0o666)  # each task's jobs run as a user of its own (as root)

    def held(self, name: str) -> pb.Step:
        """A job that writes `name` as it starts, then runs until `open_(name)`."""
        gate = self.where / f"gate-{name}"
        return shell_step(
            "work", f"echo {name} >> {self.starts}; while [ ! -e {gate} ]; do sleep 0.05; done"
        )

    def quick(self, name: str) -> pb.Step:
        return shell_step("work", f"echo {name} >> {self.starts}")

    def started(self) -> list[str]:
        return self.starts.read_text().split()

    def more_than(self, count: int) -> bool:
        return len(self.started()) > count

    def opened(self, name: str) -> bool:
        return (self.where / f"gate-{name}").exists()

    def open_(self, names: Iterable[str]) -> None:
        for name in names:
            (self.where / f"gate-{name}").touch()


async def stored_but(db_url: str, task_ids: Iterable[str]) -> dict[str, list[Any]]:
    """Every row of the engine's tables (`snapshot`) but those of `task_ids`."""
    return {
        table: [row for row in rows if not any(task_id in str(row) for task_id in task_ids)]
        for table, rows in (await snapshot(db_url)).items()
    }


async def start(
    served: RunningEngine, caller: str, spec: pb.TaskSpec, task_id: str | None = None
) -> str:
    task_id = task_id or new_task_id()
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=spec), metadata=as_caller(caller)
    )
    return task_id


async def test_a_flood_of_jobs_delays_another_tenants_next_job_by_one_slot_at_most(
    secured: Settings, tmp_path: Path
) -> None:
    """Two slots. Project-a starts six long jobs: two run, four wait. Project-b's one job
    then waits too; the first slot to free is its, before a's other four."""
    gates = Gates(tmp_path)
    flood = [f"a{i}" for i in range(6)]
    async with serving(secured, max_running_jobs=2) as served:
        slots = served.engine.runs.jobs.slots
        try:
            a_ids = [
                await start(served, "a-orchestrator", tenant_task("project-a", gates.held(name)))
                for name in flood
            ]
            await until(
                lambda: (slots.running("project-a"), slots.waiting("project-a")) == (2, 4),
                "two of a's jobs run and four wait",
            )
            b_id = await start(served, "b-orchestrator", tenant_task("project-b", gates.quick("b")))
            await until(lambda: slots.waiting("project-b") == 1, "b's job waits for a slot")

            # Free one slot at a time (the oldest running job of a's) until b's job started.
            for _ in flood:
                seen = gates.started()
                if "b" in seen:
                    break
                gates.open_([next(name for name in seen if not gates.opened(name))])
                await until(partial(gates.more_than, len(seen)), "a freed slot is taken")
            started = gates.started()
            assert started.index("b") == 2, f"b's job started after {started[: started.index('b')]}"
            b = await wait_for_status(served.stub, b_id, metadata=as_caller("b-orchestrator"))
            assert b.status == pb.SUCCEEDED
        finally:
            gates.open_(flood)
        for task_id in a_ids:
            a = await wait_for_status(served.stub, task_id, metadata=as_caller("a-orchestrator"))
            assert a.status == pb.SUCCEEDED
        assert sorted(gates.started()) == sorted([*flood, "b"])


async def test_a_tenant_at_its_running_jobs_cap_waits_while_slots_are_free(
    secured: Settings, tmp_path: Path
) -> None:
    """Three slots, one job per tenant. Project-a's second job waits although two slots are
    free; project-b's job starts and ends meanwhile; a's second starts when its first ends."""
    gates = Gates(tmp_path)
    async with serving(secured, max_running_jobs=3, max_running_jobs_per_tenant=1) as served:
        slots = served.engine.runs.jobs.slots
        try:
            a_ids = [
                await start(served, "a-orchestrator", tenant_task("project-a", gates.held(name)))
                for name in ("a0", "a1")
            ]
            await until(
                lambda: (slots.running("project-a"), slots.waiting("project-a")) == (1, 1),
                "one of a's jobs runs and one waits",
            )
            b_id = await start(served, "b-orchestrator", tenant_task("project-b", gates.quick("b")))
            b = await wait_for_status(served.stub, b_id, metadata=as_caller("b-orchestrator"))
            assert b.status == pb.SUCCEEDED
            first, *others = gates.started()
            assert others == ["b"]  # a's second still waits
            gates.open_([first])
            await until(partial(gates.more_than, 2), "a's second job started")
        finally:
            gates.open_(["a0", "a1"])
        for task_id in a_ids:
            a = await wait_for_status(served.stub, task_id, metadata=as_caller("a-orchestrator"))
            assert a.status == pb.SUCCEEDED


async def test_a_tenant_at_its_running_workflows_cap_is_refused_and_nothing_is_stored(
    secured: Settings, db_url: str, tmp_path: Path
) -> None:
    """Cap 2. Project-a runs two workflows: a third start, and the approval that would run a
    paused one, are RESOURCE_EXHAUSTED naming the setting, and store nothing; project-b
    starts as before. Once one of a's ends, the start is taken; once that one ends, the
    approval."""
    gates = Gates(tmp_path)
    setting = "WORKFLOW_ENGINE_MAX_RUNNING_WORKFLOWS_PER_TENANT"
    async with serving(secured, max_running_workflows_per_tenant=2) as served:
        orchestrator = as_caller("a-orchestrator")
        paused = await start(
            served,
            "a-orchestrator",
            tenant_task("project-a", step("gate", "true", requires_approval=True)),
        )
        await wait_for_status(served.stub, paused, {pb.WAITING_FOR_APPROVAL}, metadata=orchestrator)
        assert await served.engine.runs.wait(paused, 30)  # its run ended: it runs no more
        running = [
            await start(served, "a-orchestrator", tenant_task("project-a", gates.held(name)))
            for name in ("a0", "a1")
        ]
        try:
            # The two that run write on (checkpoints, lease renewals): everything else stays.
            before = await stored_but(db_url, running)
            refused_id, third = new_task_id(), tenant_task("project-a", gates.quick("a2"))
            with pytest.raises(grpc.aio.AioRpcError) as start_refused:
                await start(served, "a-orchestrator", third, refused_id)
            approve = pb.ApprovalDecision(step_id="gate", verdict=pb.APPROVE)
            with pytest.raises(grpc.aio.AioRpcError) as resume_refused:
                await served.stub.ResumeWorkflow(
                    pb.ResumeWorkflowRequest(task_id=paused, decision=approve),
                    metadata=as_caller("a-operator"),
                )
            assert await stored_but(db_url, running) == before
            assert refused_id not in str(before)
            for refused in (start_refused.value, resume_refused.value):
                assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert (refused.details() or "").startswith(f"{setting}: project 'project-a'")

            b_id = await start(served, "b-orchestrator", tenant_task("project-b", gates.quick("b")))
            b = await wait_for_status(served.stub, b_id, metadata=as_caller("b-orchestrator"))
            assert b.status == pb.SUCCEEDED

            gates.open_(["a0"])
            await wait_for_status(served.stub, running[0], metadata=orchestrator)
            assert await served.engine.runs.wait(running[0], 30)
            await start(served, "a-orchestrator", third, refused_id)
            await wait_for_status(served.stub, refused_id, metadata=orchestrator)
            assert await served.engine.runs.wait(refused_id, 30)
            await served.stub.ResumeWorkflow(
                pb.ResumeWorkflowRequest(task_id=paused, decision=approve),
                metadata=as_caller("a-operator"),
            )
        finally:
            gates.open_(["a0", "a1"])
        for task_id in (*running, refused_id, paused):
            ended = await wait_for_status(served.stub, task_id, metadata=orchestrator)
            assert ended.status == pb.SUCCEEDED, task_id


async def test_a_caller_at_its_watch_cap_is_refused_until_one_of_its_watches_ends(
    secured: Settings, tmp_path: Path
) -> None:
    """Cap 2. a-reader holds two watches: a third is RESOURCE_EXHAUSTED naming the setting,
    while another caller of the same project watches on. A watch that ends (its workflow
    ended) and one the caller drops each make room for one more."""
    gates = Gates(tmp_path)
    setting = "WORKFLOW_ENGINE_MAX_WATCHES_PER_CALLER"
    reader = as_caller("a-reader")
    async with serving(secured, max_watches_per_caller=2) as served:
        ids = [
            await start(served, "a-orchestrator", tenant_task("project-a", gates.held(name)))
            for name in ("w0", "w1", "w2")
        ]

        def watch(task_id: str, metadata: list[tuple[str, str]] = reader) -> Any:
            return served.stub.WatchWorkflow(
                pb.WatchWorkflowRequest(task_id=task_id), metadata=metadata
            )

        async def refused(task_id: str) -> grpc.aio.AioRpcError:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await watch(task_id).read()
            return caught.value

        try:
            first, second = watch(ids[0]), watch(ids[1])
            for call in (first, second):
                assert (await call.read()).status == pb.RUNNING  # held, counted
            third = await refused(ids[2])
            assert third.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (third.details() or "").startswith(f"{setting}: caller 'a-reader'")
            other = watch(ids[2], as_caller("a-operator"))
            assert (await other.read()).status == pb.RUNNING
            other.cancel()

            gates.open_(["w0"])  # first's workflow ends, and so does its stream
            last = await first.read()
            while (event := await first.read()) != grpc.aio.EOF:
                last = event
            assert last.status in TERMINAL
            third_call = watch(ids[2])
            assert (await third_call.read()).status == pb.RUNNING

            assert (await refused(ids[0])).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            second.cancel()  # dropped by the caller: the engine gives its place back
            # The engine learns of the drop when the cancel reaches it: until then, refused.
            deadline = time.monotonic() + 30
            while True:
                call = watch(ids[1])
                try:
                    assert (await call.read()).status == pb.RUNNING
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                    assert time.monotonic() < deadline, "the dropped watch was never given back"
                    await asyncio.sleep(0.05)
            call.cancel()
            third_call.cancel()
        finally:
            gates.open_(["w0", "w1", "w2"])
        for task_id in ids:
            await wait_for_status(served.stub, task_id, metadata=as_caller("a-orchestrator"))


async def test_a_caller_scoped_to_a_user_gets_no_more_room_by_naming_projects(
    secured: Settings, tmp_path: Path
) -> None:
    """Found by issue 61's own round (finding d): the caps and the fair job slots are a
    project's, and a caller scoped to users only may name any project, so each project it made
    up was a tenant of its own with a cap of its own. Now such a caller's workflows are its
    user's: with a cap of 1, its second workflow is refused whatever project it names, naming
    the user; another tenant starts as before."""
    gates = Gates(tmp_path)
    setting = "WORKFLOW_ENGINE_MAX_RUNNING_WORKFLOWS_PER_TENANT"
    async with serving(secured, max_running_workflows_per_tenant=1) as served:
        first = tenant_task("made-up-1", gates.held("u0"), user="someone-u")
        running = await start(served, "u-orchestrator", first)
        try:
            second = tenant_task("made-up-2", gates.quick("u1"), user="someone-u")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await start(served, "u-orchestrator", second)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (refused.value.details() or "").startswith(f"{setting}: user 'someone-u'")
            b_id = await start(served, "b-orchestrator", tenant_task("project-b", gates.quick("b")))
            b = await wait_for_status(served.stub, b_id, metadata=as_caller("b-orchestrator"))
            assert b.status == pb.SUCCEEDED
        finally:
            gates.open_(["u0"])
        ended = await wait_for_status(served.stub, running, metadata=as_caller("u-orchestrator"))
        assert ended.status == pb.SUCCEEDED, ended.error
