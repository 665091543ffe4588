"""Case 9: a checkpoint edited to garbage or to an object payload is refused, never executed.

An edit of LangGraph's bookkeeping fails the workflow with the reason. An edit of `state` is a
change by another writer (the row's digest no longer matches): the workflow is held for an
operator with `blocked_reason`, and not failed, resumed or rewritten.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

from tests.chaos.conftest import record
from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.helpers import new_task_id, step, task, wait_for_status
from workflow_engine.config import Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb

PICKLE = "gASVKAAAAAAAAACMBXBvc2l4lIwGc3lzdGVtlJOUjAJpZJSFlFKULg=="  # os.system('id')
TAMPERING = {
    "state is a string": "state = to_jsonb('garbage'::text)",
    "state is an array": "state = '[1, 2, 3]'::jsonb",
    "checkpoint is junk": "checkpoint = '{\"junk\": true}'::jsonb",
    "checkpoint is a pickle": f"checkpoint = to_jsonb('{PICKLE}'::text)",
    "versions_seen wrong type": "checkpoint = jsonb_set(checkpoint, '{versions_seen}', '\"x\"')",
    "LangChain constructor in state": (
        "state = jsonb_set(state, '{plan,assumptions}', "
        '\'[{"lc": 1, "type": "constructor", "id": ["os", "system"], "kwargs": {}}]\')'
    ),
    "jsonpickle object in bookkeeping": (
        "checkpoint = jsonb_set(checkpoint, '{channel_values,x}', "
        '\'{"py/object": "subprocess.Popen"}\')'
    ),
}
_refused: list[str] = []


@pytest.mark.parametrize("edit", sorted(TAMPERING), ids=sorted(TAMPERING))
async def test_tampered_checkpoint_is_refused(
    settings: Settings, db_url: str, tmp_path: Path, edit: str
) -> None:
    marker = tmp_path / "second-step-ran"
    task_id = new_task_id()
    spec = task(step("first", "sleep", "0.3"), step("second", "touch", str(marker)))
    first = await start_engine(settings.with_overrides(recovery_enabled=False))
    await first.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    run = first.engine.runs.get(task_id)
    while run is not None and run.last_node != "dispatch_step":
        await asyncio.sleep(0.01)
    await stop_engine(first)  # drained at a node boundary: RUNNING, lease released
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT status, last_node_id FROM workflow_checkpoints")
        status, last_node = await cur.fetchone()
        assert status == "RUNNING" and last_node is not None
        await conn.execute(f"UPDATE workflow_checkpoints SET {TAMPERING[edit]}")

    adopter = await start_engine(settings.with_overrides(holder_id="adopter"))
    try:
        if TAMPERING[edit].startswith("state"):
            wf = await _wait_until_blocked(adopter, task_id)
            assert wf.status == pb.RUNNING and not wf.lease_holder_id
            assert "changed outside the engine" in wf.blocked_reason
        else:
            wf = await wait_for_status(adopter.stub, task_id, timeout=20)
            assert wf.status == pb.FAILED
            assert "task " + task_id in wf.error and "checkpoint" in wf.error
    finally:
        await stop_engine(adopter)
    assert not marker.exists()  # nothing ran from the tampered checkpoint
    _refused.append(edit)
    record("9 tampered checkpoint", variants_refused=len(_refused), executed_from_tampered=0)


async def _wait_until_blocked(replica: RunningEngine, task_id: str) -> pb.Workflow:
    """GetWorkflow once the adopting replica's claim met the edit and recorded it."""
    for _ in range(400):
        wf = await replica.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
        if any(e.kind == pb.BLOCKED for e in wf.history):
            return wf
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{task_id} was never blocked")
