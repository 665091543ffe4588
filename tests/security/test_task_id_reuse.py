"""A task id started again after its rows were pruned gets nothing of the run before it.

Attacker: tenant B, who knows tenant A's task id (it is in logs, links, the orchestrator's
tables) and starts a task under it once A's finished workflow was pruned with its rows
(``WORKFLOW_ENGINE_RETENTION_DELETE_ROWS=true``), while A's job directories are still kept
(they are kept a week by default). Worst case before: B's first step never ran and B was handed
A's stored job result, A's secret unmasked in it (B's plan has no secrets); B's next step ran as
A's user and read what A's job left in its /tmp.

The promise: job ids, the job's user and its /tmp are the workflow run's (`JobRequest.run_id`,
`job_id_for`), and a start after a prune is a new run: B's steps run, as a user of their own,
with a /tmp of their own.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import RunningEngine
from tests.security.conftest import as_caller, tenant_task
from tests.support.helpers import open_to_jobs, shell_step, wait_for_status
from workflow_engine.config import Settings
from workflow_engine.runtime._retention import prune_command
from workflow_engine.v1 import workflow_engine_pb2 as pb

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="jobs run as users of their own only when the engine is root"
)


async def test_a_pruned_task_id_started_by_another_tenant_runs_afresh(
    served: RunningEngine, secured: Settings, tmp_path: Path
) -> None:
    task_id = str(uuid.uuid4())
    secret = "a-secret-" + uuid.uuid4().hex
    told = open_to_jobs(tmp_path / "told")
    # Tenant A: a step that prints its secret, leaves a file in /tmp and says who it ran as.
    a_step = shell_step(
        "first",
        f'echo "token=$TOKEN"; echo a-note > /tmp/a-note; id -u > {told}/a-uid',
        env={"TOKEN": secret},
        secret_env=["TOKEN"],
    )
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=tenant_task("project-a", a_step)),
        metadata=as_caller("a-orchestrator"),
    )
    a_run = await wait_for_status(served.stub, task_id, metadata=as_caller("a-orchestrator"))
    assert a_run.status == pb.SUCCEEDED, a_run.error
    a_uid = (told / "a-uid").read_text().strip()

    # The operator's prune, rows and all, of everything finished.
    pruning = replace(secured, retention=replace(secured.retention, delete_rows=True))
    report = await prune_command(pruning, 0, dry_run=False)
    assert report.startswith("pruned 1 finished"), report

    # Tenant B starts the same task id: a step of the same id, then one that looks around.
    b_task = tenant_task(
        "project-b",
        shell_step("first", "echo b-ran; id -u"),
        shell_step("second", "id -u; cat /tmp/a-note 2>&1; true"),
    )
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=b_task),
        metadata=as_caller("b-orchestrator"),
    )
    b_run = await wait_for_status(served.stub, task_id, metadata=as_caller("b-orchestrator"))
    assert b_run.status == pb.SUCCEEDED, b_run.error
    assert b_run.run_id != a_run.run_id
    out = {r["step_id"]: r["stdout"] for r in b_run.state["results"]}
    shown = str(b_run.state)
    assert secret not in shown and "token=" not in shown, "B was handed A's job result"
    assert out["first"].split() == ["b-ran", out["first"].split()[1]]
    b_uid = out["first"].split()[1]
    assert b_uid != a_uid, "B's job ran as A's user"
    assert out["second"].split()[0] == b_uid
    assert out["second"].splitlines()[1:] == ["cat: /tmp/a-note: No such file or directory"], (
        "B's job read A's /tmp"
    )
