"""The benchmark's rows with two engine processes measure both processes, not the kernel's
luck: `contenders.spread_channels` gives each an even share of the client's connections."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, shell_step, task
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
pytestmark = pytest.mark.e2e


async def leases_by_process(db_url: str) -> dict[str, int]:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT holder_process, count(*) FROM task_workflow_leases"
            " WHERE holder_id IS NOT NULL GROUP BY holder_process"
        )
        return {holder: count for holder, count in await cur.fetchall()}


async def test_channels_spread_evenly_over_two_engine_processes(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from contenders import spread_channels

    supervisor = EngineProcess(
        db_url=db_url,
        data_dir=tmp_path / "data",
        holder_id="pair",
        extra_env={"WORKFLOW_ENGINE_PROCESSES": "2"},
    )
    try:
        # 8 connections left to the kernel's hash split 4:4 only 70 times in 256.
        channels = await spread_channels(supervisor.address, supervisor.proc.pid, 8)
        try:
            assert len(channels) == 8
            spec = task(shell_step("wait", "sleep 10"))
            for channel in channels:
                stub = pb_grpc.WorkflowEngineStub(channel)
                await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=new_task_id(), task=spec))
            # A workflow's lease is taken by the engine process its call reached.
            assert await leases_by_process(db_url) == {"pair/1": 4, "pair/2": 4}
        finally:
            for channel in channels:
                await channel.close()
    finally:
        supervisor.kill()
