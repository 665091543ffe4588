"""Every answer StartWorkflow gives, one row per case, each the truth about the task's workflow.

One engine with recovery off serves every row, so a workflow whose lease is not live stays as it
is; a second one is drained mid-run to leave a RUNNING workflow with a released lease. Every
answer but STARTED must leave every stored row as it was.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import grpc
import pytest

from tests.conftest import RunningEngine, start_engine
from tests.support.helpers import new_task_id, snapshot, step, task
from workflow_engine.config import Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

ORCH, INTRUDER = "orch", "intruder"
LONG_TTL = 600  # no lease renewal (every ttl/3) writes anything while the rows are asked


@dataclass(frozen=True)
class Target:
    task_id: str
    key: str
    run_id: str


@dataclass(frozen=True)
class Ok:
    status: pb.StartStatus.ValueType
    workflow_status: pb.WorkflowStatus.ValueType


@dataclass(frozen=True)
class Refused:
    code: grpc.StatusCode
    says: tuple[str, ...]


HELD = Refused(grpc.StatusCode.FAILED_PRECONDITION, (f"holder {ORCH!r}", " until 2"))


def exists(status: str) -> Refused:
    return Refused(
        grpc.StatusCode.ALREADY_EXISTS, (f"(status {status})", "use ResumeWorkflow or GetWorkflow")
    )


# (workflow the start aims at, holder, key: the one that started it / another / none, answer)
ROWS: list[tuple[str, str, str, Ok | Refused]] = [
    ("new", ORCH, "other", Ok(pb.STARTED, pb.RUNNING)),
    # The same key, the workflow not finished.
    ("live", ORCH, "same", Ok(pb.ALREADY_RUNNING, pb.RUNNING)),
    ("approval", ORCH, "same", Ok(pb.ALREADY_RUNNING, pb.WAITING_FOR_APPROVAL)),
    ("approval", INTRUDER, "same", Ok(pb.ALREADY_RUNNING, pb.WAITING_FOR_APPROVAL)),
    ("suspended", ORCH, "same", Ok(pb.ALREADY_RUNNING, pb.SUSPENDED)),
    ("drained", ORCH, "same", Ok(pb.ALREADY_RUNNING, pb.RUNNING)),
    # The same key, the workflow finished.
    ("succeeded", ORCH, "same", Ok(pb.ALREADY_FINISHED, pb.SUCCEEDED)),
    ("succeeded", INTRUDER, "same", Ok(pb.ALREADY_FINISHED, pb.SUCCEEDED)),
    ("failed", ORCH, "same", Ok(pb.ALREADY_FINISHED, pb.FAILED)),
    ("cancelled", ORCH, "same", Ok(pb.ALREADY_FINISHED, pb.CANCELLED)),
    # A live lease: another holder with any key or none, or its holder with another key or none.
    ("live", INTRUDER, "same", HELD),
    ("live", INTRUDER, "other", HELD),
    ("live", INTRUDER, "none", HELD),
    ("live", ORCH, "other", HELD),
    ("live", ORCH, "none", HELD),
    # No live lease, and another key or none.
    ("approval", ORCH, "other", exists("WAITING_FOR_APPROVAL")),
    ("approval", INTRUDER, "none", exists("WAITING_FOR_APPROVAL")),
    ("suspended", ORCH, "none", exists("SUSPENDED")),
    ("drained", ORCH, "other", exists("RUNNING")),
    ("succeeded", ORCH, "other", exists("SUCCEEDED")),
    ("succeeded", ORCH, "none", exists("SUCCEEDED")),
    ("failed", INTRUDER, "other", exists("FAILED")),
    ("cancelled", ORCH, "none", exists("CANCELLED")),
]


@pytest.fixture
async def quiet(settings: Settings) -> AsyncIterator[RunningEngine]:
    """An engine that adopts nothing, so a released lease stays released."""
    engine = await start_engine(replace(settings, recovery_enabled=False))
    try:
        yield engine
    finally:
        await engine.channel.close()
        await engine.server.stop(drain_timeout=0.5)


async def settle(
    stub: pb_grpc.WorkflowEngineStub,
    task_id: str,
    status: int,
    holder: str = "",
    node: str | None = None,
) -> pb.Workflow:
    """Wait until the workflow has `status`, lease holder `holder` ("" = none live) and node."""
    deadline = time.monotonic() + 60
    while True:
        wf = await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
        if (
            wf.status == status
            and wf.lease_holder_id == holder
            and (node is None or wf.last_node_id == node)
        ):
            return wf
        assert time.monotonic() < deadline, f"{task_id} stuck: {wf.status} {wf.lease_holder_id}"
        await asyncio.sleep(0.05)


async def start(
    engine: RunningEngine, spec: pb.TaskSpec, status: int, holder: str = "", node: str | None = None
) -> Target:
    task_id, key = new_task_id(), str(uuid.uuid4())
    answer = await engine.stub.StartWorkflow(
        pb.StartWorkflowRequest(
            task_id=task_id,
            holder_id=ORCH,
            idempotency_key=key,
            task=spec,
            lease_ttl_seconds=LONG_TTL,
        )
    )
    assert answer.status == pb.STARTED
    if status != pb.RUNNING or node is not None:
        await settle(engine.stub, task_id, status, holder, node)
    return Target(task_id, key, answer.run_id)


async def test_every_start_answer_tells_the_truth_and_only_started_changes_anything(
    settings: Settings, quiet: RunningEngine, db_url: str
) -> None:
    # A RUNNING workflow whose lease was released: its replica drained (shut down) while it ran.
    drained_replica = await start_engine(
        replace(settings, recovery_enabled=False, holder_id="replica-a")
    )
    try:
        drained = await start(drained_replica, task(step("s", "sleep", "5")), pb.RUNNING)
    finally:
        await drained_replica.channel.close()
        await drained_replica.server.stop(drain_timeout=0.5)
    await settle(quiet.stub, drained.task_id, pb.RUNNING)

    gate = task(step("gate", "true", requires_approval=True))
    targets = {
        "live": await start(
            quiet, task(step("s", "sleep", "30")), pb.RUNNING, ORCH, node="dispatch_step"
        ),
        "approval": await start(quiet, gate, pb.WAITING_FOR_APPROVAL),
        "suspended": await start(
            quiet,
            task(step("a", "true"), step("b", "true"), budget=pb.Budget(max_dispatches=1)),
            pb.SUSPENDED,
        ),
        "drained": drained,
        "succeeded": await start(quiet, task(step("s", "true")), pb.SUCCEEDED),
        "failed": await start(quiet, task(step("s", "false"), max_attempts_per_step=1), pb.FAILED),
        "cancelled": await start(quiet, gate, pb.WAITING_FOR_APPROVAL),
    }
    await quiet.stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=targets["cancelled"].task_id))
    await settle(quiet.stub, targets["cancelled"].task_id, pb.CANCELLED)

    for aim, holder, key_kind, expected in ROWS:
        row = f"{aim}, {holder}, {key_kind} key"
        target = targets.get(aim) or Target(new_task_id(), "", "")
        key = {"same": target.key, "other": str(uuid.uuid4()), "none": ""}[key_kind]
        request = pb.StartWorkflowRequest(
            task_id=target.task_id,
            holder_id=holder,
            idempotency_key=key,
            task=task(step("s", "true")),
            lease_ttl_seconds=LONG_TTL,
        )
        before = await snapshot(db_url)
        if isinstance(expected, Refused):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await quiet.stub.StartWorkflow(request)
            details = err.value.details() or ""
            assert err.value.code() == expected.code, f"{row}: {err.value.code()} {details}"
            for fragment in expected.says:
                assert fragment in details, f"{row}: {details!r} lacks {fragment!r}"
        else:
            answer = await quiet.stub.StartWorkflow(request)
            got = (
                pb.StartStatus.Name(answer.status),
                pb.WorkflowStatus.Name(answer.workflow_status),
            )
            want = (
                pb.StartStatus.Name(expected.status),
                pb.WorkflowStatus.Name(expected.workflow_status),
            )
            assert got == want, row
            if expected.status == pb.STARTED:
                assert (answer.lease_id, answer.holder_id) == (key, holder), row
                await settle(quiet.stub, target.task_id, pb.SUCCEEDED)
                continue
            assert answer.run_id == target.run_id, row
            if aim == "live":  # the lease that runs it
                assert (answer.lease_id, answer.holder_id) == (target.key, ORCH), row
                assert answer.HasField("lease_expires_at"), row
            else:  # no lease is live
                assert (answer.lease_id, answer.holder_id) == ("", ""), row
                assert not answer.HasField("lease_expires_at"), row
        assert await snapshot(db_url) == before, f"{row}: stored rows changed"
