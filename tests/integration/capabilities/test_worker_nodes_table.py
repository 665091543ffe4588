"""The ``nodes`` worker with its nodes from the orchestrator's ``nodes`` table, end to end.

The database holds the orchestrator's tables as their ORM creates them
(`tests.support.orchestrator_schema`); the nodes are `TheirWorkerNode`s (real HTTP servers answering
as theirs do) registered there as rows with capability snapshots, as their handlers write
them. The engine has no nodes file: it reads the table at start and every refresh.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from google.protobuf import json_format

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support import database
from tests.support.helpers import new_task_id, step, task, wait_for_status
from tests.support.model_server import API_KEY, MODEL, ModelServer
from tests.support.orchestrator_schema import insert_node, insert_snapshot
from tests.support.their_worker_node import TheirWorkerNode
from workflow_engine.config import LlmSettings, NodesSettings, Settings
from workflow_engine.errors import NodesTableMissing
from workflow_engine.v1 import workflow_engine_pb2 as pb

TOKEN = "token-from-the-nodes-table"


@pytest.fixture
def served() -> Iterator[Callable[[str], TheirWorkerNode]]:
    """Serves worker nodes, each expecting `TOKEN`; stops them after the test."""
    nodes: list[TheirWorkerNode] = []

    def serve(name: str) -> TheirWorkerNode:
        node = TheirWorkerNode(name=name, token=TOKEN).serve()
        nodes.append(node)
        return node

    yield serve
    for node in nodes:
        node.stop()


@pytest.fixture
async def orch(orchestrator_url: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """A connection to the orchestrator's database, as their control plane writes it."""
    assert database.ROUTE is not None
    direct = database.ROUTE.direct(psycopg.conninfo.conninfo_to_dict(orchestrator_url)["dbname"])
    async with await psycopg.AsyncConnection.connect(direct, autocommit=True) as conn:
        yield conn


EngineFor = Callable[..., Awaitable[RunningEngine]]


@pytest.fixture
async def engine_for(settings: Settings, orchestrator_url: str) -> AsyncIterator[EngineFor]:
    """Starts an engine with the ``nodes`` worker and no nodes file on the orchestrator's db."""
    started: list[RunningEngine] = []

    async def start(
        *, planner: str = "static", llm: Any = None, command_policy_file: str = "", **nodes: Any
    ) -> RunningEngine:
        options = {
            "refresh_seconds": 0.3,
            "health_interval_seconds": 0.2,
            "wait_seconds": 5.0,
            "retry_seconds": 1.0,
            "connect_timeout_seconds": 1.0,
            **nodes,
        }
        running = await start_engine(
            replace(
                settings,
                database_url=orchestrator_url,
                worker="nodes",
                nodes=NodesSettings(**options),
                planner=planner,
                command_policy_file=command_policy_file,
                **({"llm": llm} if llm is not None else {}),
                **database.engine_settings(orchestrator_url),  # type: ignore[arg-type]
            )
        )
        started.append(running)
        return running

    yield start
    for running in started:
        if running.server.engine.pool.closed:
            continue  # stopped by the test
        await stop_engine(running)


async def start(running: RunningEngine, spec: pb.TaskSpec) -> str:
    task_id = new_task_id()
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    return task_id


def target(workflow: pb.Workflow, step_id: str = "s") -> str:
    state = json_format.MessageToDict(workflow.state)
    name: str = state["steps"][step_id]["job"]["target"]
    return name


def findings(workflow: pb.Workflow, step_id: str = "s") -> str:
    """Why the step's job failed, whole (the error and the findings shorten it)."""
    state = json_format.MessageToDict(workflow.state)
    stderr: str = state["steps"][step_id]["result"]["stderr"]
    return stderr


@pytest.mark.parametrize("orchestrator_url", ["plain", "soft_delete"], indirect=True)
async def test_a_step_runs_on_the_node_whose_latest_snapshot_has_its_labels(
    orchestrator_url: str,
    orch: psycopg.AsyncConnection[Any],
    served: Callable[[str], TheirWorkerNode],
    engine_for: EngineFor,
) -> None:
    """The job goes to the node whose *latest* snapshot reports a GPU, with the token from its
    row (their node answers 401 to any other); soft-deleted rows and snapshots do not count."""
    cpu, gpu = served("cpu-1"), served("gpu-1")
    cpu_id = await insert_node(orch, "cpu-1", url=cpu.url, token=TOKEN)
    await insert_snapshot(orch, cpu_id, {"node": {"node_slug": "cpu-1"}, "gpu": {"present": False}})
    gpu_id = await insert_node(orch, "gpu-1", url=gpu.url, token=TOKEN)
    await insert_snapshot(orch, gpu_id, {"gpu": {"present": True}}, seconds_ago=10)
    await insert_snapshot(orch, gpu_id, {"gpu": {"present": False}}, seconds_ago=60)
    if "soft_delete" in orchestrator_url:
        # A newer report that was deleted, and a deleted node that sorts first by name.
        await insert_snapshot(orch, gpu_id, {"gpu": {"present": False}})
        await orch.execute(
            "UPDATE node_capabilities SET deleted_at = now() WHERE reported_at > now() - "
            "interval '1 second'"
        )
        gone = served("a-gone")
        gone_id = await insert_node(orch, "a-gone", url=gone.url, token=TOKEN)
        await insert_snapshot(orch, gone_id, {"gpu": {"present": True}})
        await orch.execute("UPDATE nodes SET deleted_at = now() WHERE id = %s", (gone_id,))

    running = await engine_for()
    spec = task(
        step("plain", "true"),
        step("s", "echo", "trained", required_labels=["capabilities=gpu", "gpu.present"]),
    )
    workflow = await wait_for_status(running.stub, await start(running, spec))
    assert workflow.status == pb.SUCCEEDED, workflow.error
    assert target(workflow) == "gpu-1"
    assert len(gpu.runs) >= 1 and sum(cpu.requests.values()) <= 1
    if "soft_delete" in orchestrator_url:
        assert not gone.requests


async def test_inactive_nodes_get_no_jobs_and_a_node_added_later_is_picked_up(
    orch: psycopg.AsyncConnection[Any],
    served: Callable[[str], TheirWorkerNode],
    engine_for: EngineFor,
) -> None:
    """A dispatch waiting for a node gets the one registered meanwhile, after a refresh (and
    its labels, which no node had when the workflow started, were accepted); once disabled, it
    gets no new jobs, and the finding says why."""
    idle, late = served("a-drained"), served("b-late")
    drained_id = await insert_node(orch, "a-drained", url=idle.url, token=TOKEN, status="drained")
    await insert_snapshot(orch, drained_id, {})
    running = await engine_for(wait_seconds=5.0)
    task_id = await start(running, task(step("s", "true", required_labels=["gpu.present"])))
    await asyncio.sleep(0.5)  # the dispatch is waiting: no usable node yet
    async with orch.transaction():  # the node and its snapshot appear together
        late_id = await insert_node(orch, "b-late", url=late.url, token=TOKEN)
        await insert_snapshot(orch, late_id, {"gpu": {"present": True}})
    began = time.monotonic()
    workflow = await wait_for_status(running.stub, task_id)
    assert workflow.status == pb.SUCCEEDED, workflow.error
    assert time.monotonic() - began < 3  # a refresh, not the end of the wait
    assert target(workflow) == "b-late" and not idle.requests

    await orch.execute("UPDATE nodes SET status = 'inactive' WHERE id = %s", (late_id,))
    await asyncio.sleep(0.8)
    spec = task(step("s", "true"), max_attempts_per_step=1)
    workflow = await wait_for_status(running.stub, await start(running, spec))
    assert workflow.status == pb.FAILED
    why = findings(workflow)
    assert "b-late is not usable (status 'inactive' in the orchestrator's nodes table)" in why
    assert "a-drained is not usable (status 'drained'" in why
    assert len(late.runs) == 1 and not idle.requests


async def test_a_job_whose_node_left_the_table_is_lost_with_the_reason(
    orch: psycopg.AsyncConnection[Any],
    served: Callable[[str], TheirWorkerNode],
    engine_for: EngineFor,
) -> None:
    """The job is recorded for its node; the engine stops mid-job; the node's row is deleted;
    the engine that resumes the workflow has never known the node: the job is lost, named."""
    node = served("gpu-1")
    node_id = await insert_node(orch, "gpu-1", url=node.url, token=TOKEN)
    first = await engine_for()
    task_id = await start(first, task(step("s", "sleep", "30"), max_attempts_per_step=1))
    deadline = time.monotonic() + 10
    while not node.running:
        assert time.monotonic() < deadline, "the job never started"
        await asyncio.sleep(0.02)
    (job_id,) = node.running
    await first.channel.close()
    await first.server.stop(drain_timeout=0.2)
    await orch.execute("DELETE FROM nodes WHERE id = %s", (node_id,))

    second = await engine_for()  # its recovery adopts the workflow
    workflow = await wait_for_status(second.stub, task_id)
    assert workflow.status == pb.FAILED
    assert (
        f"job {job_id} was lost: it was sent to node 'gpu-1', which this engine does not know "
        "(the orchestrator's nodes table no longer lists it)"
    ) in findings(workflow)


async def test_without_a_nodes_file_or_table_the_start_stops_naming_both_settings(
    settings: Settings,
) -> None:
    with pytest.raises(NodesTableMissing) as err:
        await start_engine(replace(settings, worker="nodes"))
    assert "WORKFLOW_ENGINE_NODES_FILE is not set" in str(err.value)
    assert "WORKFLOW_ENGINE_NODES_SOURCE=orchestrator" in str(err.value)


async def test_the_llm_planner_is_told_the_labels_of_the_nodes_in_the_table(
    orch: psycopg.AsyncConnection[Any],
    served: Callable[[str], TheirWorkerNode],
    engine_for: EngineFor,
    tmp_path: Path,
) -> None:
    """With nodes from the orchestrator's table (no nodes file), the planner's brief names the
    labels their latest snapshots give, so the model can ask for them."""
    gpu = served("gpu-1")
    gpu_id = await insert_node(orch, "gpu-1", url=gpu.url, token=TOKEN)
    await insert_snapshot(orch, gpu_id, {"gpu": {"present": True}})
    model = ModelServer()
    try:
        model.script("plan", {"steps": [{"id": "s", "command": ["echo", "hi"]}], "assumptions": []})
        (tmp_path / "policy.json").write_text(json.dumps({"allow": ["echo"]}))
        running = await engine_for(
            planner="llm",
            llm=LlmSettings(base_url=model.base_url, model=MODEL, api_key=API_KEY, retries=0),
            command_policy_file=str(tmp_path / "policy.json"),
        )
        task_id = await start(running, pb.TaskSpec(prompt="train the model on a GPU"))
        await _until_asked(model, "plan")
        (call,) = model.asked("plan")
        brief = json.dumps(call.body["messages"])
        assert "gpu.present" in brief and "capabilities=gpu" in brief, brief
        assert task_id
    finally:
        model.stop()


async def _until_asked(model: ModelServer, schema_name: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not model.asked(schema_name):
        assert time.monotonic() < deadline, f"the model was never asked for {schema_name}"
        await asyncio.sleep(0.05)
