"""An exception inside a node is a recorded finding on the retry path, never a silent loss."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import replace

import pytest
from google.protobuf import json_format

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.helpers import new_task_id, step, task, wait_for_status
from tests.unit.capabilities.test_factory import LENT_NOTHING
from workflow_engine.capabilities import build_capabilities
from workflow_engine.config import Settings
from workflow_engine.domain import (
    AcceptanceCriterion,
    JobRequest,
    JobResult,
    Step,
    TaskSpec,
    Verification,
)
from workflow_engine.domain.held import Held
from workflow_engine.v1 import workflow_engine_pb2 as pb


class Faulty:
    """Wraps the real capabilities; each named call raises its first `fail_times` times."""

    def __init__(self, inner: object, fail_times: int) -> None:
        self.inner = inner
        self.left = fail_times

    def trip(self) -> None:
        if self.left > 0:
            self.left -= 1
            raise RuntimeError("judge down")


class FaultyVerifier(Faulty):
    async def verify(
        self,
        step: Step,
        result: JobResult,
        criteria: Sequence[AcceptanceCriterion],
        preferences: object = None,
        *,
        run_id: str = "",
        secrets: Collection[str] = (),
    ) -> Verification:
        self.trip()
        return await self.inner.verify(step, result, criteria)  # type: ignore[attr-defined]


class FaultyTargets(Faulty):
    def unfit(self, step: Step) -> tuple[str, str] | None:
        return self.inner.unfit(step)  # type: ignore[attr-defined, no-any-return]

    async def select_target(self, job: JobRequest) -> str:
        self.trip()
        return await self.inner.select_target(job)  # type: ignore[attr-defined]

    async def run(self, target: str, job: JobRequest) -> JobResult:
        return await self.inner.run(target, job)  # type: ignore[attr-defined]

    async def cancel(self, target: str, job: JobRequest) -> None:
        await self.inner.cancel(target, job)  # type: ignore[attr-defined]

    def held(self) -> list[Held]:
        return self.inner.held()  # type: ignore[attr-defined, no-any-return]


class BrokenStoredTasks:
    """The stored task cannot be read (load_task_context's one read)."""

    async def load(self, task_id: str) -> TaskSpec:
        raise RuntimeError("task table unreachable")

    def stored(self, task_id: str, spec: TaskSpec) -> None:
        pass

    def held(self) -> list[Held]:
        return []


@pytest.fixture
async def engine_with(settings: Settings) -> AsyncIterator[object]:
    """Start an engine whose capabilities `change` rewrites; stopped after the test."""
    started: list[RunningEngine] = []

    async def start(change: object) -> RunningEngine:
        engine_caps = build_capabilities(settings, LENT_NOTHING)
        running = await start_engine(settings, change(engine_caps))  # type: ignore[operator]
        started.append(running)
        return running

    yield start
    for running in started:
        await stop_engine(running)


async def test_a_raising_verifier_is_a_failed_finding_and_the_step_is_retried(
    engine_with: object,
) -> None:
    verifier: list[FaultyVerifier] = []

    def change(caps: object) -> object:
        verifier.append(FaultyVerifier(caps.verifier, fail_times=1))  # type: ignore[attr-defined]
        return replace(caps, verifier=verifier[0])  # type: ignore[type-var]

    running: RunningEngine = await engine_with(change)  # type: ignore[operator]
    task_id = new_task_id()
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=task(step("s", "echo", "hi")))
    )
    wf = await wait_for_status(running.stub, task_id)
    assert wf.status == pb.SUCCEEDED, wf.error
    assert json_format.MessageToDict(wf.state)["attempts_by_step"] == {"s": 2}
    verified = [e.detail for e in wf.history if e.node_id == "verify_step_result"]
    assert verified == ["s: pending", "s: passed"]  # the exception was a failed verification


async def test_a_verifier_that_keeps_raising_fails_the_workflow_with_its_message(
    engine_with: object,
) -> None:
    def change(caps: object) -> object:
        return replace(caps, verifier=FaultyVerifier(caps.verifier, fail_times=99))  # type: ignore[attr-defined, type-var]

    running: RunningEngine = await engine_with(change)  # type: ignore[operator]
    task_id = new_task_id()
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(
            task_id=task_id, task=task(step("s", "echo", "hi"), max_attempts_per_step=2)
        )
    )
    wf = await wait_for_status(running.stub, task_id)
    assert wf.status == pb.FAILED
    assert "step s failed after 2 attempt(s)" in wf.error
    assert "the verifier raised RuntimeError('judge down')" in wf.error


async def test_a_raising_target_selection_is_retried(engine_with: object) -> None:
    def change(caps: object) -> object:
        return replace(caps, worker=FaultyTargets(caps.worker, fail_times=1))  # type: ignore[attr-defined, type-var]

    running: RunningEngine = await engine_with(change)  # type: ignore[operator]
    task_id = new_task_id()
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=task(step("s", "echo", "hi")))
    )
    wf = await wait_for_status(running.stub, task_id)
    assert wf.status == pb.SUCCEEDED, wf.error
    assert json_format.MessageToDict(wf.state)["attempts_by_step"] == {"s": 2}


async def test_an_exception_in_a_node_fails_the_workflow_with_its_message(
    engine_with: object,
) -> None:
    def change(caps: object) -> object:
        return replace(caps, stored_tasks=BrokenStoredTasks())  # type: ignore[type-var]

    running: RunningEngine = await engine_with(change)  # type: ignore[operator]
    task_id = new_task_id()
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=task(step("s", "true")))
    )
    wf = await wait_for_status(running.stub, task_id)
    assert wf.status == pb.FAILED
    assert "node load_task_context raised RuntimeError('task table unreachable')" in wf.error
    assert len(running.engine.runs) == 0  # the process is fine; the run ended normally
