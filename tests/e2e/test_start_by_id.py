"""A task started by id, the engine killed before its first node: the resume runs the task as
it was stored at start, whatever the orchestrator has done to its row since."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import grpc
import psycopg
import pytest
from google.protobuf import json_format

from tests.conftest import start_engine, stop_engine
from tests.support import database
from tests.support.engine_process import EngineProcess
from tests.support.helpers import wait_for_status
from tests.support.orchestrator_schema import insert_task
from workflow_engine.config import Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    "change",
    ["UPDATE tasks SET prompt = '$ false' WHERE id = %s", "DELETE FROM tasks WHERE id = %s"],
)
async def test_a_resume_runs_the_task_as_stored_whatever_became_of_its_row(
    orchestrator_url: str,
    settings: Settings,
    tmp_path: Path,
    processes: list[EngineProcess],
    change: str,
) -> None:
    async with await psycopg.AsyncConnection.connect(orchestrator_url, autocommit=True) as conn:
        task_id = await insert_task(conn, prompt="$ echo hello")
    # Killed as load_task_context's checkpoint is about to be written: the workflow and its
    # task are stored, no node is.
    first = EngineProcess(
        db_url=orchestrator_url,
        data_dir=tmp_path / "first",
        holder_id="engine-1",
        recovery=False,
        faults="kill:before:load_task_context",
    )
    processes.append(first)
    async with grpc.aio.insecure_channel(first.address) as channel:
        try:
            await pb_grpc.WorkflowEngineStub(channel).StartWorkflow(
                pb.StartWorkflowRequest(task_id=task_id)
            )
        except grpc.aio.AioRpcError as err:  # the kill may beat the answer out
            assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert first.proc.wait(30) == -9
    assert first.count("fault_injected") == 1

    async with await psycopg.AsyncConnection.connect(orchestrator_url, autocommit=True) as conn:
        await conn.execute(change, (task_id,))
    # The same holder takes over its own lease at once (a restarted runner).
    second = await start_engine(
        replace(
            settings,
            database_url=orchestrator_url,
            holder_id="engine-1",
            **database.engine_settings(orchestrator_url),  # type: ignore[arg-type]
        )
    )
    try:
        resumed = await second.stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=task_id))
        assert resumed.resumed
        done = await wait_for_status(second.stub, task_id)
        assert done.status == pb.SUCCEEDED, done.error
        state = json_format.MessageToDict(done.state)
        assert state["prompt"] == "$ echo hello"
        assert [r["stdout"] for r in state["results"]] == ["hello\n"]
    finally:
        await stop_engine(second)
