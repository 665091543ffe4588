"""At most one active workflow per task, decided by the lease in PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

from tests.conftest import RunningEngine
from tests.support.helpers import new_task_id, step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb


async def test_racing_starts_have_exactly_one_winner(running: RunningEngine) -> None:
    task_id = new_task_id()
    spec = task(step("hold", "sleep", "1.5"))
    holders = [f"runner-{i}" for i in range(12)]

    async def start(holder: str) -> pb.StartWorkflowResponse | grpc.aio.AioRpcError:
        try:
            return await running.stub.StartWorkflow(
                pb.StartWorkflowRequest(task_id=task_id, holder_id=holder, task=spec)
            )
        except grpc.aio.AioRpcError as err:
            return err

    answers = await asyncio.gather(*(start(h) for h in holders))
    winners = [a for a in answers if isinstance(a, pb.StartWorkflowResponse)]
    refused = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
    assert len(winners) == 1 and winners[0].status == pb.STARTED
    winner = winners[0].holder_id
    assert len(refused) == len(holders) - 1
    for err in refused:
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"holder {winner!r}" in (err.details() or "")
        assert "until" in (err.details() or "")

    wf = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert wf.lease_holder_id == winner and wf.run_id == winners[0].run_id
    await wait_for_status(running.stub, task_id)


async def test_same_holder_and_key_again_is_already_running(running: RunningEngine) -> None:
    task_id, key = new_task_id(), str(uuid.uuid4())
    request = pb.StartWorkflowRequest(
        task_id=task_id, holder_id="orch", idempotency_key=key, task=task(step("s", "sleep", "1"))
    )
    first = await running.stub.StartWorkflow(request)
    again = await running.stub.StartWorkflow(request)
    assert first.status == pb.STARTED
    assert again.status == pb.ALREADY_RUNNING
    assert (again.run_id, again.lease_id) == (first.run_id, first.lease_id)
    assert first.lease_id == key

    # The same holder without the key, or with another key, is a conflict like anyone else.
    for other_key in ("", str(uuid.uuid4())):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await running.stub.StartWorkflow(
                pb.StartWorkflowRequest(
                    task_id=task_id,
                    holder_id="orch",
                    idempotency_key=other_key,
                    task=task(step("s", "sleep", "1")),
                )
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    await wait_for_status(running.stub, task_id)
    # After it finished, the same start is answered with the truth; a new key is refused.
    late = await running.stub.StartWorkflow(request)
    assert late.status == pb.ALREADY_FINISHED and late.run_id == first.run_id
    assert late.workflow_status == pb.SUCCEEDED
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await running.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=task(step("s", "true")))
        )
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_another_replica_cannot_resume_a_live_lease(
    running: RunningEngine, second_replica: RunningEngine
) -> None:
    task_id = new_task_id()
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=task(step("s", "sleep", "1")))
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await second_replica.stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=task_id))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "test-engine" in (err.value.details() or "")
    wf = await wait_for_status(second_replica.stub, task_id)  # any replica can read it
    assert wf.status == pb.SUCCEEDED


async def test_resume_while_running_here_returns_the_live_checkpoint(
    running: RunningEngine,
) -> None:
    task_id = new_task_id()
    await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=task(step("s", "sleep", "1")))
    )
    resumed = await running.stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=task_id))
    assert resumed.status == pb.RUNNING and not resumed.resumed
    await wait_for_status(running.stub, task_id)
