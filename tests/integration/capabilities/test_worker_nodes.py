"""The ``nodes`` worker end to end: gRPC StartWorkflow, the engine, worker nodes over HTTP.

The nodes are `TheirWorkerNode`s: real HTTP servers on free ports answering as the
orchestrator's worker node does (exit code omitted when 0, their extra fields, problem
documents), each counting requests and runs per job id. Nothing is mocked: the engine reads a
real nodes file, polls ``/readyz``, and sends ``POST /v1/worker/jobs:run`` over sockets.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.helpers import (
    check,
    new_task_id,
    shell_step,
    step,
    task,
    wait_for_status,
    write_secret,
)
from tests.support.their_worker_node import TheirWorkerNode, nodes_file_entry
from workflow_engine.config import NodesSettings, Settings
from workflow_engine.errors import CapabilityConfigError
from workflow_engine.v1 import workflow_engine_pb2 as pb

TOKEN = "node-token"


class Cluster:
    """Worker nodes serving, and the nodes file the engine reads them from."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.nodes: dict[str, TheirWorkerNode] = {}
        self.entries: list[dict[str, Any]] = []
        write_secret(tmp_path / "token", TOKEN + "\n")

    def add(
        self,
        name: str,
        *,
        labels: Any = None,
        token: str = TOKEN,
        max_jobs: int = 4,
        **behaviour: Any,
    ) -> TheirWorkerNode:
        node = TheirWorkerNode(name=name, token=TOKEN, **behaviour).serve()
        self.nodes[name] = node
        token_file = "token"
        if token != TOKEN:  # the engine is configured with another token than the node's
            token_file = f"token-{name}"
            write_secret(self.dir / token_file, token)
        entry = nodes_file_entry(node, token_file, max_jobs=max_jobs)
        if labels is not None:
            entry["labels"] = labels
        self.entries.append(entry)
        return node

    def file(self) -> Path:
        path = self.dir / "nodes.json"
        path.write_text(json.dumps(self.entries))
        return path

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path)
    yield nodes
    nodes.stop()


EngineFor = Callable[..., Awaitable[RunningEngine]]


@pytest.fixture
async def engine_for(settings: Settings, cluster: Cluster) -> AsyncIterator[EngineFor]:
    """Starts an engine with the ``nodes`` worker on the cluster's nodes file."""
    started: list[RunningEngine] = []

    async def start(**nodes: Any) -> RunningEngine:
        options = {
            "file": str(cluster.file()),
            "health_interval_seconds": 0.2,
            "wait_seconds": 2.0,
            "retry_seconds": 1.0,
            "connect_timeout_seconds": 1.0,
            **nodes,
        }
        running = await start_engine(
            replace(settings, worker="nodes", nodes=NodesSettings(**options))
        )
        started.append(running)
        return running

    yield start
    for running in started:
        await stop_engine(running)


async def run_to_end(
    running: RunningEngine, spec: pb.TaskSpec, timeout: float = 30
) -> tuple[pb.Workflow, dict[str, Any]]:
    """Start `spec`, wait for its end; the workflow and its state as JSON."""
    task_id = new_task_id()
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    workflow = await wait_for_status(running.stub, task_id, timeout=timeout)
    return workflow, json_format.MessageToDict(workflow.state)


def step_state(state: dict[str, Any], step_id: str) -> dict[str, Any]:
    result: dict[str, Any] = state["steps"][step_id]
    return result


async def test_a_step_runs_on_the_only_node_with_its_required_labels(
    cluster: Cluster, engine_for: EngineFor
) -> None:
    """Labels as a list and as a map; the job gets the engine's variables in its env; their
    answer (no exit_code for 0, extra fields, an artifact with inline content) reads as a
    completed job with exit code 0 and the artifact as a link."""
    cpu = cluster.add("cpu-node", labels=["cpu"])
    gpu = cluster.add("gpu-node", labels={"capabilities": ["gpu", "cuda"], "locality": "eu"})
    running = await engine_for()
    spec = task(
        shell_step("anywhere", "echo attempt=$WORKFLOW_ENGINE_ATTEMPT"),
        step(
            "train",
            "echo",
            "trained",
            required_labels=["capabilities=gpu", "locality=eu"],
            expect=[check("stdout_contains", "trained")],
        ),
    )
    workflow, state = await run_to_end(running, spec)
    assert workflow.status == pb.SUCCEEDED, workflow.error

    train = step_state(state, "train")
    job_id = train["job"]["request"]["job_id"]
    assert train["job"]["target"] == "gpu-node"
    assert (gpu.runs[job_id], cpu.requests[job_id]) == (1, 0)
    assert "exit_code" not in gpu.answers[job_id]  # their encoder left it out...
    assert train["result"]["exit_code"] == 0  # ...and it reads as 0
    assert train["result"]["target"] == "gpu-node"
    assert train["result"]["artifacts"] == [
        {
            "name": "out.txt",
            "content_type": "text/plain",
            "size_bytes": len("trained\n"),
            "ref": f"{gpu.url}/artifacts/{job_id}/out.txt",
        }
    ]
    anywhere = step_state(state, "anywhere")
    assert anywhere["result"]["stdout"] == "attempt=1\n"
    assert anywhere["job"]["target"] == "cpu-node"  # equally idle: by name


async def test_a_node_whose_readyz_fails_gets_no_new_jobs(
    cluster: Cluster, engine_for: EngineFor
) -> None:
    first = cluster.add("a-node", not_ready="draining")
    second = cluster.add("b-node")
    running = await engine_for()
    outcomes = await asyncio.gather(
        *(run_to_end(running, task(step("s", "true"))) for _ in range(4))
    )
    assert all(workflow.status == pb.SUCCEEDED for workflow, _ in outcomes)
    assert {step_state(state, "s")["job"]["target"] for _, state in outcomes} == {"b-node"}
    assert not first.requests and len(second.runs) == 4

    # The other way round, once the poller has seen both change.
    first.not_ready, second.not_ready = None, "disk full"
    await asyncio.sleep(0.6)
    workflow, state = await run_to_end(running, task(step("s", "true")))
    assert workflow.status == pb.SUCCEEDED
    assert step_state(state, "s")["job"]["target"] == "a-node"


async def test_load_spreads_across_the_nodes_under_concurrency(
    cluster: Cluster, engine_for: EngineFor
) -> None:
    """Room for every job on either node: only the load decides where each goes."""
    nodes = [cluster.add("a-node", max_jobs=20), cluster.add("b-node", max_jobs=20)]
    running = await engine_for()
    outcomes = await asyncio.gather(
        *(run_to_end(running, task(step("s", "sleep", "0.5"))) for _ in range(8))
    )
    assert all(workflow.status == pb.SUCCEEDED for workflow, _ in outcomes)
    per_node = [len(node.runs) for node in nodes]
    assert sum(per_node) == 8 and min(per_node) >= 3, per_node


async def test_a_full_node_gets_no_more_than_max_jobs(
    cluster: Cluster, engine_for: EngineFor
) -> None:
    """One node, room for 2: the third job waits for a free place, then runs there."""
    node = cluster.add("a-node", max_jobs=2)
    running = await engine_for(wait_seconds=10.0)
    outcomes = await asyncio.gather(
        *(run_to_end(running, task(step("s", "sleep", "0.5"))) for _ in range(5))
    )
    assert all(workflow.status == pb.SUCCEEDED for workflow, _ in outcomes)
    assert len(node.runs) == 5 and node.peak == 2


async def test_a_5xx_is_retried_with_the_same_job_id_and_the_job_runs_once(
    cluster: Cluster, engine_for: EngineFor
) -> None:
    node = cluster.add("a-node", fail_next=2)
    running = await engine_for(retry_seconds=10.0)
    workflow, state = await run_to_end(running, task(step("s", "echo", "once")))
    assert workflow.status == pb.SUCCEEDED, workflow.error
    job_id = step_state(state, "s")["job"]["request"]["job_id"]
    assert (node.requests[job_id], node.runs[job_id]) == (3, 1)
    assert step_state(state, "s")["attempts"] == 1


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("401", "HTTP 401 Unauthorized: Invalid or missing bearer token"),
        ("413", "HTTP 413 Request Entity Too Large: Request body exceeds maximum size"),
        ("400", "HTTP 400 Bad Request: image not found: no-such-image"),
    ],
)
async def test_a_4xx_answer_fails_the_attempt_with_the_nodes_message_unretried(
    cluster: Cluster, engine_for: EngineFor, case: str, message: str
) -> None:
    behaviour: dict[str, Any] = {
        "401": {"token": "not-the-nodes-token"},
        "413": {"max_body_bytes": 200},
        "400": {"images": {"alpine:latest"}},
    }[case]
    node = cluster.add("a-node", **behaviour)
    running = await engine_for(retry_seconds=10.0)
    spec = task(step("s", "echo", "x", image="no-such-image"), max_attempts_per_step=1)
    started = time.monotonic()
    workflow, state = await run_to_end(running, spec)
    assert time.monotonic() - started < 5  # not retried for the 10 s retry budget
    assert workflow.status == pb.FAILED
    assert f"node a-node refused the job: {message}" in workflow.error
    findings = step_state(state, "s")["verification"]["findings"]
    assert any(message in f["detail"] for f in findings if not f["passed"]), findings
    assert not node.runs and sum(node.requests.values()) <= 1


async def test_with_no_eligible_node_the_attempt_fails_after_the_wait_saying_why(
    cluster: Cluster, engine_for: EngineFor
) -> None:
    cluster.add("a-node", labels=["cpu"])
    cluster.add("b-node", labels=["gpu"], not_ready="maintenance")
    running = await engine_for(wait_seconds=1.0)
    spec = task(step("s", "true", required_labels=["gpu"]), max_attempts_per_step=2)
    started = time.monotonic()
    workflow, state = await run_to_end(running, spec)
    elapsed = time.monotonic() - started
    assert workflow.status == pb.FAILED
    assert 2.0 <= elapsed < 10, elapsed  # two attempts, each waiting its second
    assert "no worker node could take step s within 1 s (required labels: gpu)" in workflow.error
    assert "a-node lacks gpu" in workflow.error
    assert "b-node is not ready (readyz 503: maintenance)" in workflow.error
    assert step_state(state, "s")["attempts"] == 2


async def test_a_step_needing_labels_no_node_in_the_file_has_is_refused_at_start(
    cluster: Cluster, engine_for: EngineFor
) -> None:
    """The nodes file's nodes are all this engine has: a step only a node with both labels
    could run is refused, naming the field, and nothing is stored or sent."""
    a_node = cluster.add("a-node", labels=["cpu", "linux"])
    b_node = cluster.add("b-node", labels=["gpu"])
    running = await engine_for()
    task_id = new_task_id()
    spec = task(step("plain", "true"), step("s", "true", required_labels=["gpu", "linux"]))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == (
        "task.steps[1].required_labels: no worker node in the nodes file has gpu, linux "
        "(a-node has cpu, linux; b-node has gpu)"
    )
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert not a_node.runs and not b_node.runs


async def test_a_node_dying_mid_job_loses_the_attempt_and_a_new_one_runs_elsewhere(
    cluster: Cluster, engine_for: EngineFor
) -> None:
    first = cluster.add("a-node")
    second = cluster.add("b-node")
    running = await engine_for(retry_seconds=1.0)
    task_id = new_task_id()
    spec = task(step("s", "sleep", "2"), max_attempts_per_step=2)
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    deadline = time.monotonic() + 10
    while not first.running:
        assert time.monotonic() < deadline, "the job never started on a-node"
        await asyncio.sleep(0.02)
    (lost_job,) = first.running
    first.stop()

    # The first attempt's verdict stays in the step's state while the second one runs.
    seen: list[str] = []
    deadline = time.monotonic() + 30
    while True:
        workflow = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
        state = json_format.MessageToDict(workflow.state)
        verdict = step_state(state, "s").get("verification") or {}
        seen += [f["detail"] for f in verdict.get("findings", []) if not f["passed"]]
        if workflow.status in (pb.SUCCEEDED, pb.FAILED):
            break
        assert time.monotonic() < deadline, "the workflow did not end"
        await asyncio.sleep(0.05)
    assert workflow.status == pb.SUCCEEDED, workflow.error
    assert any(f"job {lost_job} was lost: node a-node did not answer" in d for d in seen), seen
    retried = step_state(state, "s")
    assert retried["attempts"] == 2
    new_job = retried["job"]["request"]["job_id"]
    assert new_job != lost_job and retried["job"]["target"] == "b-node"
    assert first.runs[lost_job] == 1 and lost_job not in second.requests  # never re-run elsewhere
    assert second.runs[new_job] == 1


async def test_cancel_aborts_the_request_in_flight(cluster: Cluster, engine_for: EngineFor) -> None:
    node = cluster.add("a-node")
    running = await engine_for()
    task_id = new_task_id()
    spec = task(step("s", "sleep", "30"))
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    deadline = time.monotonic() + 10
    while not node.running:
        assert time.monotonic() < deadline, "the job never started"
        await asyncio.sleep(0.02)
    (job_id,) = node.running
    await running.stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=task_id, reason="stop"))
    deadline = time.monotonic() + 5
    while job_id not in node.disconnected:
        assert time.monotonic() < deadline, "the engine kept its request open"
        await asyncio.sleep(0.02)
    workflow = await wait_for_status(running.stub, task_id)
    assert workflow.status == pb.CANCELLED
    # And asked the node to stop it, through the extension this node lacks (404: tolerated).
    deadline = time.monotonic() + 5
    while f"POST /v1/worker/jobs/{job_id}:cancel" not in node.unknown:
        assert time.monotonic() < deadline, node.unknown
        await asyncio.sleep(0.02)


async def test_a_bad_nodes_file_stops_the_start_naming_the_node_and_field(
    settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text("- name: n1\n  url: http://127.0.0.1:1\n  token_env: NO_SUCH_TOKEN_VARIABLE\n")
    with pytest.raises(CapabilityConfigError) as err:
        await start_engine(replace(settings, worker="nodes", nodes=NodesSettings(file=str(path))))
    assert str(err.value) == (
        f"WORKFLOW_ENGINE_NODES_FILE {path}: nodes[0] ('n1').token_env: "
        "variable NO_SUCH_TOKEN_VARIABLE is not set or empty"
    )
