"""The loader's variables (``LD_PRELOAD``, ``GCONV_PATH``, ...) never reach a job: a tenant's
step, an operator's EDIT and a worker-node request that set one are refused naming the field,
and a step an earlier version stored with one is refused when it would be dispatched.

Whatever runs as root before a job drops to its user would load code named by these variables;
the sandbox gives caller env to nothing that runs as root, and this is the second layer.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import httpx
import psycopg
import pytest
from google.protobuf import json_format
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Json

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.e2e.node.bodies import run_body
from tests.integration.storage.test_stored_before import FIXTURE, FIXTURE_SCHEMA, TABLES
from tests.security.conftest import as_caller, tenant_task
from tests.support import database
from tests.support.helpers import new_task_id, open_to_jobs, snapshot, step, struct, wait_for_status
from tests.support.node_process import NodeProcess
from workflow_engine.capabilities import JobTracker, LocalSandboxWorker
from workflow_engine.config import Settings
from workflow_engine.domain import JobRequest, Sandbox
from workflow_engine.errors import InvalidArgument
from workflow_engine.storage import migrate
from workflow_engine.v1 import workflow_engine_pb2 as pb

#: A shared object that does not exist: the loader says so and runs the program anyway, so a
#: job that was given it leaves its marker.
EVIL = "/nonexistent/evil.so"


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    return open_to_jobs(tmp_path / "shared")


@pytest.mark.parametrize(
    "name", ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH", "GLIBC_TUNABLES"]
)
async def test_a_tenants_step_with_a_loader_variable_is_refused(
    served: RunningEngine, db_url: str, name: str
) -> None:
    before = await snapshot(db_url)
    spec = tenant_task("project-a", step("s", "true", env={"LANG": "C", name: EVIL}))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await served.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=new_task_id(), task=spec),
            metadata=as_caller("a-orchestrator"),
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith(f"task.steps[0].env[{name}]: ")
    assert await snapshot(db_url) == before


async def test_an_edit_decision_or_a_set_state_with_ld_preload_is_refused(
    served: RunningEngine, db_url: str, shared: Path
) -> None:
    marker = shared / "ran"
    task_id = new_task_id()
    spec = tenant_task("project-a", step("ship", "touch", str(marker), requires_approval=True))
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=spec), metadata=as_caller("a-orchestrator")
    )
    await wait_for_status(
        served.stub, task_id, {pb.WAITING_FOR_APPROVAL}, metadata=as_caller("a-operator")
    )
    before = await snapshot(db_url)
    edit = pb.ApprovalDecision(step_id="ship", verdict=pb.EDIT, env={"LD_PRELOAD": EVIL})
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await served.stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(task_id=task_id, decision=edit),
            metadata=as_caller("a-operator"),
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("decision.env[LD_PRELOAD]: ")
    # Nor may the orchestrator's set_state put one in the plan.
    plan = {
        "steps": [{"id": "ship", "command": ["touch", str(marker)], "env": {"LD_PRELOAD": EVIL}}]
    }
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await served.stub.UpdateWorkflow(
            pb.UpdateWorkflowRequest(
                task_id=task_id, operator="o", set_state=struct({"plan": plan})
            ),
            metadata=as_caller("a-orchestrator"),
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("set_state.plan.steps[0].env[LD_PRELOAD]: ")
    assert await snapshot(db_url) == before
    assert not marker.exists()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    process = NodeProcess(data_dir=tmp_path / "node")
    yield process
    process.kill()


async def test_a_worker_node_refuses_a_request_with_ld_preload(
    node: NodeProcess, shared: Path
) -> None:
    marker = shared / "ran"
    body = run_body("touch", str(marker), env={"LD_PRELOAD": EVIL})
    async with httpx.AsyncClient(base_url=node.url, headers=node.headers, timeout=30) as client:
        response = await client.post("/v1/worker/jobs:run", json=body)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["field"] == "sandbox.env[LD_PRELOAD]"
    assert not marker.exists()


def rows_with_loader_env(marker: Path) -> dict[str, Any]:
    """The rows an earlier version wrote for a workflow paused before its step `ship`, with
    that step (in the stored task and plan) made to touch `marker` with LD_PRELOAD set: an
    earlier version accepted that."""
    rows: dict[str, Any] = json.loads(FIXTURE.read_text())
    ship = {"command": ["touch", str(marker)], "env": {"LD_PRELOAD": EVIL}}
    state = rows["workflow_checkpoints"][0]["state"]
    for steps in (state["plan"]["steps"], rows["workflow_tasks"][0]["spec"]["steps"]):
        steps[1].update(ship)
    state["pending_approval"].update(ship)
    return rows


@pytest.fixture
async def upgraded(
    pg_server_url: str, settings: Settings, shared: Path
) -> AsyncIterator[tuple[RunningEngine, str, Path]]:
    """An engine started on the rows of `rows_with_loader_env`, loaded at the schema they
    were written with; and the task id and marker of its workflow."""
    marker = shared / "ran"
    rows = rows_with_loader_env(marker)
    name = f"t_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {name}")
    url = make_conninfo(pg_server_url, dbname=name)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await migrate(conn, up_to=FIXTURE_SCHEMA)
        for table in TABLES:
            await conn.execute(
                f"INSERT INTO {table} SELECT * FROM json_populate_recordset(NULL::{table}, %s)",
                (Json(rows[table]),),
            )
    assert database.ROUTE is not None
    replica = await start_engine(replace(settings, database_url=database.ROUTE.client(name)))
    try:
        yield replica, rows["workflow_checkpoints"][0]["task_id"], marker
    finally:
        await stop_engine(replica)
        async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def test_a_step_stored_with_ld_preload_by_an_earlier_version_never_runs(
    upgraded: tuple[RunningEngine, str, Path],
) -> None:
    running, task_id, marker = upgraded
    waiting = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert waiting.status == pb.WAITING_FOR_APPROVAL
    assert dict(waiting.pending_approval.env) == {"LD_PRELOAD": EVIL}

    approve = pb.ApprovalDecision(step_id="ship", verdict=pb.APPROVE)
    await running.stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=task_id, decision=approve))
    done = await wait_for_status(running.stub, task_id)

    assert done.status == pb.FAILED
    assert "step ship" in done.error and "LD_PRELOAD" in done.error
    ship = json_format.MessageToDict(done.state)["steps"]["ship"]
    assert not ship.get("job"), "no job was recorded for it"
    (finding,) = ship["verification"]["findings"]
    assert finding["check"] == "env" and not finding["passed"]
    assert not marker.exists()


async def test_a_job_recorded_with_ld_preload_is_never_started(
    tmp_path: Path, shared: Path
) -> None:
    """A job an earlier version dispatched (recorded) with LD_PRELOAD and did not start before
    it stopped: the run that re-joins it does not start it."""
    marker = shared / "ran"
    recorded = JobRequest(
        task_id=new_task_id(),
        job_id=str(uuid.uuid4()),
        sandbox=Sandbox(command=("touch", str(marker)), env={"LD_PRELOAD": EVIL}),
    )
    async with LocalSandboxWorker(jobs_dir=tmp_path / "jobs") as worker:
        ended = await JobTracker(worker, max_running=1).wait_any([("local", recorded)])
    refused = ended[recorded.job_id]
    assert isinstance(refused, InvalidArgument)
    assert refused.field == "sandbox.env[LD_PRELOAD]"
    assert not marker.exists()
    assert not (tmp_path / "jobs" / recorded.job_id).exists()
