"""Replicas adopt RUNNING workflows whose runner vanished, up to a cap of attempts."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.helpers import new_task_id, step, task, wait_for_status
from workflow_engine.config import Settings
from workflow_engine.domain.status import RECOVERY_EXHAUSTED
from workflow_engine.graph.state import initial_state
from workflow_engine.storage import workflow_rows
from workflow_engine.storage._pool import Pool
from workflow_engine.v1 import workflow_engine_pb2 as pb


async def orphan(pool: Pool, db_url: str, spec: pb.TaskSpec, attempts: int = 0) -> str:
    """A workflow whose runner died right after StartWorkflow: RUNNING, lease expired."""
    from workflow_engine.api._requests import task_from_proto

    task_id = new_task_id()

    run_id = str(uuid.uuid4())
    await workflow_rows.create(
        pool,
        process="",
        task_id=task_id,
        run_id=run_id,
        holder_id="vanished-replica",
        idempotency_key=None,
        ttl_seconds=30,
        spec=task_from_proto(spec).to_json(),
        initial_state=dict(initial_state(task_id, run_id)),
    )
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            "UPDATE task_workflow_leases SET expires_at = now() - interval '1 second'"
        )
        await conn.execute("UPDATE workflow_checkpoints SET recovery_attempts = %s", (attempts,))
    return task_id


async def test_orphan_is_adopted_and_finished(running: RunningEngine, db_url: str) -> None:
    task_id = await orphan(running.engine.pool, db_url, task(step("a", "echo", "adopted")))
    wf = await wait_for_status(running.stub, task_id, timeout=20)
    assert wf.status == pb.SUCCEEDED
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute("SELECT recovery_attempts FROM workflow_checkpoints")
        assert await cur.fetchone() == (0,)  # progress since the adoption resets the count


async def test_poison_task_fails_once_recoveries_are_exhausted(
    running: RunningEngine, db_url: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    limit = running.engine.settings.recovery_max_attempts
    task_id = await orphan(
        running.engine.pool, db_url, task(step("a", "touch", str(marker))), attempts=limit
    )
    wf = await wait_for_status(running.stub, task_id, timeout=20)
    assert wf.status == pb.FAILED
    assert wf.error == RECOVERY_EXHAUSTED
    assert wf.lease_holder_id == ""
    assert not marker.exists()  # nothing ran


async def test_drained_runs_are_adopted_by_another_replica(settings: Settings) -> None:
    draining = await start_engine(settings)
    survivor = await start_engine(
        settings.with_overrides(holder_id="survivor", recovery_interval_seconds=0.2)
    )
    try:
        task_id = new_task_id()
        await draining.stub.StartWorkflow(
            pb.StartWorkflowRequest(
                task_id=task_id, task=task(step("slow", "sleep", "0.5"), step("b", "true"))
            )
        )
        await stop_engine(draining)  # SIGTERM path: stop at a node boundary, release the lease
        drained = await survivor.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
        assert drained.status == pb.RUNNING  # stopped at a boundary, not finished
        wf = await wait_for_status(survivor.stub, task_id, timeout=20)
        assert wf.status == pb.SUCCEEDED
        async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
            cur = await conn.execute("SELECT epoch FROM task_workflow_leases")
            assert (await cur.fetchone())[0] == 2  # taken over once, by the survivor
    finally:
        await stop_engine(survivor)
