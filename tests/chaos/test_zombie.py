"""Case 3: SIGSTOP the lease holder past its TTL, let another replica take over, SIGCONT it."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import grpc
import psycopg
import pytest

from tests.chaos.conftest import record, scale
from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, shell_step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

# Every write of a checkpoint row, with the fencing epoch it was written under.
EPOCH_HISTORY = """
CREATE TABLE epoch_history (id bigserial PRIMARY KEY, task_id uuid, lease_epoch bigint);
CREATE FUNCTION record_epoch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO epoch_history (task_id, lease_epoch) VALUES (NEW.task_id, NEW.lease_epoch);
    RETURN NULL;
END $$;
CREATE TRIGGER record_epoch AFTER INSERT OR UPDATE ON workflow_checkpoints
    FOR EACH ROW EXECUTE FUNCTION record_epoch();
"""


async def test_stopped_holder_cannot_write_after_takeover(db_url: str, tmp_path: Path) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(EPOCH_HISTORY)
    rounds = scale(1, 3)
    zombie = EngineProcess(db_url=db_url, data_dir=tmp_path / "data", holder_id="zombie", ttl=3)
    rescuer = EngineProcess(db_url=db_url, data_dir=tmp_path / "data", holder_id="rescuer", ttl=3)
    try:
        for _ in range(rounds):
            task_id = new_task_id()
            spec = task(shell_step("long", "sleep 1"), shell_step("next", "true"))
            async with grpc.aio.insecure_channel(zombie.address) as channel:
                await pb_grpc.WorkflowEngineStub(channel).StartWorkflow(
                    pb.StartWorkflowRequest(task_id=task_id, task=spec)
                )
            await asyncio.sleep(0.3)  # the job is running
            zombie.proc.send_signal(signal.SIGSTOP)
            t0 = time.monotonic()
            async with grpc.aio.insecure_channel(rescuer.address) as channel:
                wf = await wait_for_status(pb_grpc.WorkflowEngineStub(channel), task_id, timeout=30)
            takeover = time.monotonic() - t0
            assert wf.status == pb.SUCCEEDED
            zombie.proc.send_signal(signal.SIGCONT)
            await asyncio.sleep(1.5)  # let the zombie wake and try
        async with await psycopg.AsyncConnection.connect(db_url) as conn:
            cur = await conn.execute("SELECT task_id, lease_epoch FROM epoch_history ORDER BY id")
            history = await cur.fetchall()
        stale, highest = 0, {}
        for written, epoch in history:
            stale += epoch < highest.get(written, 0)
            highest[written] = max(highest.get(written, 0), epoch)
        rejected = zombie.count("run_lease_lost")
        record(
            "3 zombie (SIGSTOP)",
            rounds=rounds,
            stale_writes_accepted=stale,
            stale_writes_rejected=rejected,
            zombie_runs_stopped=rejected + zombie.count("run_stopped"),
            seconds_to_finish_after_sigstop=round(takeover, 2),
        )
        assert stale == 0
        assert rejected + zombie.count("run_stopped") == rounds  # each zombie run stopped
    finally:
        zombie.proc.send_signal(signal.SIGCONT)
        zombie.kill()
        rescuer.kill()
