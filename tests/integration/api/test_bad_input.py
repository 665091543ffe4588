"""Malformed requests get INVALID_ARGUMENT (or NOT_FOUND) naming the field, and change nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2

from tests.conftest import RunningEngine
from tests.support.helpers import (
    check,
    new_task_id,
    snapshot,
    step,
    task,
    wait_for_status,
    wait_until_released,
)
from workflow_engine.v1 import workflow_engine_pb2 as pb

UNKNOWN_TASK = "00000000-0000-4000-8000-000000000000"
GOOD = task(step("s", "echo", "ok"))


def start(**kw: Any) -> pb.StartWorkflowRequest:
    kw.setdefault("task_id", new_task_id())
    if "task" not in kw:
        kw["task"] = GOOD
    elif kw["task"] is None:
        del kw["task"]
    return pb.StartWorkflowRequest(**kw)


def infinite_preference() -> struct_pb2.Struct:
    layer = struct_pb2.Struct()
    layer.fields["budget"].number_value = float("inf")
    return layer


BAD_STARTS = [
    (
        start(task=task(step("s", "echo", expect=[check("stdout_contains", "a\x00b")]))),
        "task.steps[0].expect[0].value",
    ),
    (
        start(task=pb.TaskSpec(prompt="p", metadata=pb.TaskMetadata(labels={"k": "\x00"}))),
        "task.metadata.labels.k",
    ),
    (
        start(task=task(step("s", "echo"), preferences=[infinite_preference()])),
        "task.preferences[0]",
    ),
    (start(task_id="not-a-uuid"), "task_id"),
    (start(task_id=""), "task_id"),
    (start(idempotency_key="also-not-a-uuid"), "idempotency_key"),
    (start(task=None), "task"),
    (start(task=task(step("s"))), "task.steps[0].command"),
    (start(task=task(step("s", ""))), "task.steps[0].command[0]"),
    (
        start(task=task(step("s", "echo", expect=[check("telepathy", "x")]))),
        "task.steps[0].expect[0].kind",
    ),
    (
        start(task=task(step("s", "echo", expect=[check("stdout_matches", "(")]))),
        "task.steps[0].expect[0].value",
    ),
    (
        start(task=task(step("s", "echo", expect=[check("exit_code", equals="zero")]))),
        "task.steps[0].expect[0].equals",
    ),
    (
        start(task=task(step("s", "echo", expect=[check("json_field_equals", equals=1)]))),
        "task.steps[0].expect[0].field",
    ),
    (
        start(
            task=task(
                step("s", "echo"),
                acceptance_criteria=[pb.AcceptanceCriterion(description="x", check=check("vibes"))],
            )
        ),
        "task.acceptance_criteria[0].check.kind",
    ),
    # json_field_equals without `equals` used to mean "equals null"; JSON null must be explicit.
    (
        start(task=task(step("s", "echo", expect=[check("json_field_equals", field="n")]))),
        "task.steps[0].expect[0].equals",
    ),
    (
        start(
            task=task(
                step("s", "echo"),
                acceptance_criteria=[
                    pb.AcceptanceCriterion(
                        description="x", check=check("json_field_equals", field="n")
                    )
                ],
            )
        ),
        "task.acceptance_criteria[0].check.equals",
    ),
    # A Value with none of its kinds set is no value at all (google.protobuf.Value says so).
    (
        start(
            task=task(
                step(
                    "s",
                    "echo",
                    expect=[pb.Check(kind="exit_code", equals=struct_pb2.Value())],
                )
            )
        ),
        "task.steps[0].expect[0].equals",
    ),
    (start(task=task(step("a", "echo"), step("a", "echo"))), "task.steps[1].id"),
    (start(task=task(step("bad id!", "echo"))), "task.steps[0].id"),
    (
        start(task=task(step("a", "echo", depends_on=["b"]), step("b", "echo", depends_on=["a"]))),
        "task.steps.depends_on",
    ),
    (start(task=task(step("a", "echo", depends_on=["ghost"]))), "task.steps[0].depends_on[0]"),
    (start(task=task(step("a", "echo", env={"BAD NAME": "x"}))), "task.steps[0].env"),
    (start(task=task(step("a", "echo", timeout_seconds=999_999))), "task.steps[0].timeout_seconds"),
    (start(task=task(step("a", "echo"), max_attempts_per_step=1000)), "task.max_attempts_per_step"),
    (
        start(task=task(step("a", "echo", limits=pb.ResourceLimits(memory_mb=2**31)))),
        "task.steps[0].limits.memory_mb",
    ),
    # What the default worker, the local sandbox, could never run: refused at start too.
    (start(task=task(step("a", "true", image="python:3.11"))), "task.steps[0].image"),
    (
        start(task=task(step("a", "true"), step("b", "true", required_labels=["gpu"]))),
        "task.steps[1].required_labels",
    ),
    (start(lease_ttl_seconds=1), "lease_ttl_seconds"),
    # Nothing the planner can plan: refused at start, not FAILED by plan_steps later.
    (start(task=pb.TaskSpec()), "task.steps"),
    (start(task=pb.TaskSpec(prompt="just prose, no '$ command' lines")), "task.steps"),
    (start(task=pb.TaskSpec(prompt="$ echo" + " a" * 300)), "task.prompt"),
    (start(holder_id="x" * 1000), "holder_id"),
]


@pytest.fixture
async def seeded(running: RunningEngine, db_url: str) -> str:
    """A finished workflow, so the tables are not empty when we check nothing changed."""
    task_id = new_task_id()
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=GOOD))
    await wait_for_status(running.stub, task_id)
    # Its lease is released just after the final status; a release during a test would look
    # like a change made by the refused request.
    await wait_until_released(running.stub, task_id)
    return task_id


async def expect_error(call: Awaitable[Any], code: grpc.StatusCode, field: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == code, err.value.details()
    assert (err.value.details() or "").startswith(f"{field}:"), err.value.details()


@pytest.mark.parametrize(("request_", "field"), BAD_STARTS, ids=[f for _, f in BAD_STARTS])
async def test_bad_start_is_invalid_argument_naming_the_field(
    running: RunningEngine, db_url: str, seeded: str, request_: pb.StartWorkflowRequest, field: str
) -> None:
    before = await snapshot(db_url)
    await expect_error(
        running.stub.StartWorkflow(request_), grpc.StatusCode.INVALID_ARGUMENT, field
    )
    # The same bad task aimed at an existing workflow changes nothing either.
    if field != "task_id":
        aimed = pb.StartWorkflowRequest()
        aimed.CopyFrom(request_)
        aimed.task_id = seeded
        await expect_error(
            running.stub.StartWorkflow(aimed), grpc.StatusCode.INVALID_ARGUMENT, field
        )
    assert await snapshot(db_url) == before


CallFactory = Callable[[RunningEngine, str], Awaitable[Any]]
CALLS: dict[str, CallFactory] = {
    "get": lambda r, t: r.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=t)),
    "resume": lambda r, t: r.stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=t)),
    "cancel": lambda r, t: r.stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=t)),
    "watch": lambda r, t: _drain(r.stub.WatchWorkflow(pb.WatchWorkflowRequest(task_id=t))),
}


async def _drain(call: Any) -> list[Any]:
    return [event async for event in call]


@pytest.mark.parametrize("rpc", sorted(CALLS))
async def test_malformed_and_unknown_task_ids(
    running: RunningEngine, db_url: str, seeded: str, rpc: str
) -> None:
    before = await snapshot(db_url)
    await expect_error(CALLS[rpc](running, "nope"), grpc.StatusCode.INVALID_ARGUMENT, "task_id")
    await expect_error(CALLS[rpc](running, ""), grpc.StatusCode.INVALID_ARGUMENT, "task_id")
    await expect_error(CALLS[rpc](running, UNKNOWN_TASK), grpc.StatusCode.NOT_FOUND, "task_id")
    assert await snapshot(db_url) == before


def corrupt(request: pb.StartWorkflowRequest, marker: bytes) -> bytes:
    """The request's bytes with `marker` replaced by invalid UTF-8 of the same length."""
    data = request.SerializeToString()
    assert data.count(marker) == 1
    return data.replace(marker, b"\xff" * len(marker))


UNDECODABLE = [
    (corrupt(start(task_id="MARKMARK"), b"MARKMARK"), "task_id"),
    (
        corrupt(start(task=task(step("a", "echo"), step("b", "MARKMARK"))), b"MARKMARK"),
        "task.steps[1].command[0]",
    ),
    (
        corrupt(start(task=task(step("a", "echo", env={"K": "MARKMARK"}))), b"MARKMARK"),
        "task.steps[0].env[0].value",
    ),
    (corrupt(start(task=pb.TaskSpec(prompt="MARKMARK")), b"MARKMARK"), "task.prompt"),
    (start().SerializeToString()[:-3], "task"),  # truncated
]


@pytest.mark.parametrize(("body", "field"), UNDECODABLE, ids=[f for _, f in UNDECODABLE])
async def test_undecodable_bytes_are_invalid_argument_naming_the_field(
    running: RunningEngine, db_url: str, seeded: str, body: bytes, field: str
) -> None:
    before = await snapshot(db_url)
    raw = running.channel.unary_unary(
        "/workflow_engine.v1.WorkflowEngine/StartWorkflow",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    await expect_error(raw(body), grpc.StatusCode.INVALID_ARGUMENT, field)
    assert await snapshot(db_url) == before


def _decision(verdict: int) -> pb.ApprovalDecision:
    return pb.ApprovalDecision(step_id="s", verdict=verdict, reason="r")  # type: ignore[arg-type]


def _override(branch: int) -> pb.UpdateWorkflowRequest:
    return pb.UpdateWorkflowRequest(operator="op", force_branch=branch)  # type: ignore[arg-type]


# Every enum field of every request. A proto3 enum field carries numbers the contract does not
# define as they are, so each must be told from the UNSPECIFIED (0) that means "not set".
ENUM_CASES: list[tuple[str, CallFactory]] = [
    (
        "decision.verdict: unknown verdict 99",
        lambda r, t: r.stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(task_id=t, decision=_decision(99))
        ),
    ),
    (
        "decision.verdict: unknown verdict -1",
        lambda r, t: r.stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(task_id=t, decision=_decision(-1))
        ),
    ),
    (
        "decision.verdict: required: APPROVE, REJECT or EDIT",
        lambda r, t: r.stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(task_id=t, decision=_decision(0))
        ),
    ),
    (
        "force_branch: unknown branch 99",
        lambda r, t: r.stub.UpdateWorkflow(_with_task(_override(99), t)),
    ),
    (
        "force_branch: required: FINALIZE_SUMMARY or MARK_FAILED",
        lambda r, t: r.stub.UpdateWorkflow(_with_task(_override(0), t)),
    ),
    (
        "statuses[1]: unknown status 99",
        lambda r, t: r.stub.ListWorkflows(pb.ListWorkflowsRequest(statuses=[1, 99])),  # type: ignore[list-item]
    ),
    (
        "statuses[0]: WORKFLOW_STATUS_UNSPECIFIED is not a status",
        lambda r, t: r.stub.ListWorkflows(pb.ListWorkflowsRequest(statuses=[0])),  # type: ignore[list-item]
    ),
    (
        "kinds[1]: unknown event kind 99",
        lambda r, t: _drain(
            r.stub.WatchWorkflow(pb.WatchWorkflowRequest(task_id=t, kinds=[2, 99]))
        ),  # type: ignore[list-item]
    ),
    (
        "kinds[0]: EVENT_KIND_UNSPECIFIED is not an event kind",
        lambda r, t: _drain(r.stub.WatchWorkflow(pb.WatchWorkflowRequest(task_id=t, kinds=[0]))),  # type: ignore[list-item]
    ),
]


def _with_task(request: pb.UpdateWorkflowRequest, task_id: str) -> pb.UpdateWorkflowRequest:
    request.task_id = task_id
    return request


@pytest.mark.parametrize(("message", "call"), ENUM_CASES, ids=[m for m, _ in ENUM_CASES])
async def test_enum_values_are_told_apart_unknown_from_unset(
    running: RunningEngine, db_url: str, seeded: str, message: str, call: CallFactory
) -> None:
    before = await snapshot(db_url)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(running, seeded)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert err.value.details() == message
    assert await snapshot(db_url) == before
