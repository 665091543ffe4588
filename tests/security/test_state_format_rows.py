"""Who controls a row's `state_format` and `engine_version`: anyone who can write the table (the
orchestrator, an operator, an attacker with the database's credentials). The worst they could
do with them: make the engine fail or rewrite a workflow (it must leave it alone instead), make
its answer unreadable or too large to send (a long or binary version string in the status
message), or have an upgrade run something from the row (upgrades only rewrite JSON; the
checkpoint is refused as corrupt when it names a node the format never had).
"""

from __future__ import annotations

import grpc
import psycopg
import pytest

from tests.conftest import RunningEngine
from tests.integration.upgrade.test_newer_format import waiting
from tests.support.helpers import snapshot, wait_for_status
from workflow_engine.domain.state_format import STATE_FORMAT
from workflow_engine.v1 import workflow_engine_pb2 as pb

# Below the first format, the next format after this engine's, and the ends of the column.
EXTREMES = [-(2**31), 0, STATE_FORMAT + 1, 2**31 - 1]


async def rewrite(db_url: str, task_id: str, state_format: int, version: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            "UPDATE workflow_checkpoints SET state_format = %s, engine_version = %s,"
            " event_seq = event_seq + 1 WHERE task_id = %s",
            (state_format, version, task_id),
        )


@pytest.mark.parametrize("state_format", EXTREMES)
async def test_any_format_number_is_left_alone_and_explained(
    running: RunningEngine, db_url: str, state_format: int
) -> None:
    task_id = await waiting(running)
    await rewrite(db_url, task_id, state_format, "x" * 100_000 + "\r\n\x7f\x1b[31m")
    before = await snapshot(db_url)
    shown = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert f"state format {state_format}" in shown.blocked_reason
    assert len(shown.blocked_reason) < 400 and shown.blocked_reason.isprintable()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await running.stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(
                task_id=task_id, decision=pb.ApprovalDecision(step_id="ship", verdict=pb.APPROVE)
            )
        )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"state format {state_format}" in (caught.value.details() or "")
    assert await snapshot(db_url) == before


async def test_a_format_1_row_whose_trigger_names_no_node_of_format_1_is_not_run(
    running: RunningEngine, db_url: str
) -> None:
    """A row marked format 1 (so it is upgraded) whose checkpoint sends it to a node that
    format never had: refused as corrupt, the workflow failed with that reason, nothing run."""
    task_id = await waiting(running)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            """UPDATE workflow_checkpoints
                  SET state_format = 1, event_seq = event_seq + 1,
                      checkpoint = jsonb_set(checkpoint, '{channel_values}',
                                             '{"branch:to:exec_anything": null}')
                WHERE task_id = %s""",
            (task_id,),
        )
    with pytest.raises(grpc.aio.AioRpcError) as caught:  # the run ends before the decision
        await running.stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(
                task_id=task_id, decision=pb.ApprovalDecision(step_id="ship", verdict=pb.APPROVE)
            )
        )
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    done = await wait_for_status(running.stub, task_id)
    assert done.status == pb.FAILED
    assert "exec_anything" in done.error and "state format 1" in done.error
    assert not any(
        e.kind == pb.NODE_COMPLETED and e.node_id == "dispatch_step" for e in done.history
    )
