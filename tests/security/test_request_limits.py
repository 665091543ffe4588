"""Every list and map of every request has a limit, counted on the message before any of it is
converted: one element past it is INVALID_ARGUMENT naming the field and the limit, and changes
nothing stored (issue 48, the follow-up of finding 3).

The attacker is any authenticated caller: converting a list cost the event loop tens of
microseconds per element before its count was looked at, and some lists had no count at all
(200,000 acceptance criteria were stored after 4.2 s).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from tests.conftest import RunningEngine
from tests.security.conftest import as_caller
from tests.support.helpers import check, new_task_id, snapshot, step, struct, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb

ORCHESTRATOR = as_caller("orchestrator")
Call = Callable[[RunningEngine, str], Awaitable[Any]]


def start(spec: pb.TaskSpec) -> Call:
    request = pb.StartWorkflowRequest(task_id=new_task_id(), task=spec)
    return lambda served, _: served.stub.StartWorkflow(request, metadata=ORCHESTRATOR)


def edit(**decision: Any) -> Call:
    """ResumeWorkflow with an EDIT of the seeded workflow's pending step."""

    def call(served: RunningEngine, seeded: str) -> Awaitable[Any]:
        edited = pb.ApprovalDecision(step_id="gate", verdict=pb.EDIT, **decision)
        request = pb.ResumeWorkflowRequest(task_id=seeded, decision=edited)
        return served.stub.ResumeWorkflow(request, metadata=ORCHESTRATOR)

    return call


def set_state(count: int) -> Call:
    patch = struct({"summary": "s", **{f"k{i}": 1 for i in range(count - 1)}})

    def call(served: RunningEngine, seeded: str) -> Awaitable[Any]:
        request = pb.UpdateWorkflowRequest(task_id=seeded, operator="op", set_state=patch)
        return served.stub.UpdateWorkflow(request, metadata=ORCHESTRATOR)

    return call


def watch(served: RunningEngine, seeded: str) -> Awaitable[Any]:
    async def drain() -> None:
        request = pb.WatchWorkflowRequest(task_id=seeded, kinds=[pb.NODE_COMPLETED] * 33)
        async for _ in served.stub.WatchWorkflow(request, metadata=ORCHESTRATOR, timeout=10):
            pass

    return drain()


def listing(served: RunningEngine, seeded: str) -> Awaitable[Any]:
    request = pb.ListWorkflowsRequest(statuses=[pb.RUNNING] * 33)
    return served.stub.ListWorkflows(request, metadata=ORCHESTRATOR)


def variables(count: int) -> dict[str, str]:
    return {f"V{i}": "x" for i in range(count)}


#: (call, its error): each request is valid but for one list one element past its limit.
OVER = [
    (start(task(*(step(f"s{i}", "true") for i in range(501)))), "task.steps: more than 500 steps"),
    (
        start(
            task(
                step("s", "true"),
                acceptance_criteria=[pb.AcceptanceCriterion(description="c")] * 65,
            )
        ),
        "task.acceptance_criteria: more than 64 acceptance criteria",
    ),
    (
        start(task(step("s", "true"), preferences=[struct({"a": i}) for i in range(33)])),
        "task.preferences: more than 32 preference layers",
    ),
    (
        start(
            task(
                step("s", "true"),
                metadata=pb.TaskMetadata(labels={f"l{i}": "v" for i in range(65)}),
            )
        ),
        "task.metadata.labels: more than 64 labels",
    ),
    (
        start(task(step("s", "echo", *["a"] * 256))),
        "task.steps[0].command: more than 256 arguments",
    ),
    (
        start(task(step("s", "true", env=variables(257)))),
        "task.steps[0].env: more than 256 variables",
    ),
    (
        start(task(step("a", "true"), step("b", "true", depends_on=["a"] * 501))),
        "task.steps[1].depends_on: more than 500 dependencies",
    ),
    (
        start(task(step("s", "true", expect=[check("exit_code", equals=0)] * 65))),
        "task.steps[0].expect: more than 64 checks",
    ),
    (
        start(task(step("s", "true", required_labels=[f"l{i}" for i in range(65)]))),
        "task.steps[0].required_labels: more than 64 labels",
    ),
    (
        start(task(step("s", "true", env={"K": "v"}, secret_env=["K"] * 257))),
        "task.steps[0].secret_env: more than 256 secret variables",
    ),
    (edit(command=["echo", *["a"] * 256]), "decision.command: more than 256 arguments"),
    (edit(env=variables(257)), "decision.env: more than 256 variables"),
    (set_state(33), "set_state: more than 32 fields"),
    (watch, "kinds: more than 32 kinds"),
    (listing, "statuses: more than 32 statuses"),
]


@pytest.fixture
async def seeded(served: RunningEngine) -> str:
    """A workflow waiting for approval of step `gate`: an accepted decision or override of it
    would change what is stored."""
    task_id = new_task_id()
    gate = task(step("gate", "true", requires_approval=True))
    request = pb.StartWorkflowRequest(task_id=task_id, task=gate)
    await served.stub.StartWorkflow(request, metadata=ORCHESTRATOR)
    await wait_for_status(served.stub, task_id, {pb.WAITING_FOR_APPROVAL}, metadata=ORCHESTRATOR)
    return task_id


@pytest.mark.parametrize(("call", "error"), OVER, ids=[e.split(":")[0] for _, e in OVER])
async def test_one_past_a_limit_is_invalid_argument_naming_it_and_changes_nothing(
    served: RunningEngine, db_url: str, seeded: str, call: Call, error: str
) -> None:
    before = await snapshot(db_url)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call(served, seeded)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert refused.value.details() == error
    assert await snapshot(db_url) == before


async def test_without_authentication_lists_are_counted_too(
    running: RunningEngine, db_url: str
) -> None:
    """An engine without a tokens file reads requests in the servicer, not the interceptor."""
    criteria = [pb.AcceptanceCriterion(description="c")] * 65
    request = pb.StartWorkflowRequest(
        task_id=new_task_id(), task=task(step("s", "true"), acceptance_criteria=criteria)
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await running.stub.StartWorkflow(request)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "task.acceptance_criteria: more than 64 acceptance criteria"
    assert not any((await snapshot(db_url)).values())
