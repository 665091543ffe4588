"""The engine with two of our own `workflow-engine worker-node` processes, on free ports.

Everything here is a real process: the nodes, their jobs (the shared local job runner), and,
for the crash cases, the engine too. Each node's jobs live in its own data directory, so a
job's directory says where it ran; each command appends a line to a file per step, so the
file's lines count the runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.engine_process import EngineProcess
from tests.support.helpers import (
    job_pids,
    new_task_id,
    shell_step,
    task,
    unique_sleep,
    wait_for_status,
    write_secret,
)
from tests.support.node_process import NodeProcess
from workflow_engine.config import NodesSettings, Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e


class Fleet:
    """Two worker nodes (`gpu` has label gpu, `cpu` has cpu) and the engine's nodes file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.not_ready = root / "cpu-not-ready"
        self.gpu = NodeProcess(data_dir=root / "gpu", token="gpu-token")
        self.cpu = NodeProcess(
            data_dir=root / "cpu",
            token="cpu-token",
            args=("--not-ready-file", str(self.not_ready), "--max-body-bytes", "20000"),
        )
        for name, node in (("gpu", self.gpu), ("cpu", self.cpu)):
            write_secret(root / f"{name}.token", node.token)
        self.nodes_file = root / "nodes.json"
        self.write_nodes_file()

    def write_nodes_file(self, **overrides: dict[str, object]) -> None:
        entries = [
            {
                "name": name,
                "url": node.url,
                "token_file": str(self.root / f"{name}.token"),
                "labels": [name, "linux"],
                "max_jobs": 8,
                **overrides.get(name, {}),
            }
            for name, node in (("gpu", self.gpu), ("cpu", self.cpu))
        ]
        self.nodes_file.write_text(json.dumps(entries))

    def jobs_on(self, node: NodeProcess) -> set[str]:
        """Job ids whose directory is in `node`'s data directory."""
        return {p.name for p in node.data_dir.rglob("*") if (p / "request.json").is_file()}

    def env(self) -> dict[str, str]:
        return {
            "WORKFLOW_ENGINE_WORKER": "nodes",
            "WORKFLOW_ENGINE_NODES_FILE": str(self.nodes_file),
            "WORKFLOW_ENGINE_NODES_HEALTH_INTERVAL_SECONDS": "0.2",
            "WORKFLOW_ENGINE_NODES_RETRY_SECONDS": "2",
        }

    def stop(self) -> None:
        for node in (self.gpu, self.cpu):
            if node.alive():
                node.kill()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    nodes = Fleet(tmp_path / "fleet")
    yield nodes
    nodes.stop()


def with_nodes(settings: Settings, fleet: Fleet, **nodes: float) -> Settings:
    return replace(
        settings,
        worker="nodes",
        nodes=NodesSettings(
            file=str(fleet.nodes_file),
            health_interval_seconds=0.2,
            wait_seconds=nodes.get("wait_seconds", 5.0),
            retry_seconds=nodes.get("retry_seconds", 2.0),
        ),
    )


@pytest.fixture
async def engine(settings: Settings, fleet: Fleet) -> AsyncIterator[RunningEngine]:
    replica = await start_engine(with_nodes(settings, fleet))
    yield replica
    await stop_engine(replica)


def counted(step_id: str, runs: Path, script: str = "true", **kw: object) -> pb.Step:
    """A step that appends a line to `runs` (one per run of any of its jobs), then `script`."""
    return shell_step(step_id, f"echo run >> {runs}; {script}", **kw)


def state_of(wf: pb.Workflow) -> dict[str, object]:
    return json_format.MessageToDict(wf.state)


async def test_a_step_runs_on_the_node_with_its_labels(
    engine: RunningEngine, fleet: Fleet, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    for label, node in (("gpu", fleet.gpu), ("cpu", fleet.cpu)):
        task_id = new_task_id()
        await engine.stub.StartWorkflow(
            pb.StartWorkflowRequest(
                task_id=task_id, task=task(counted("s", runs, required_labels=[label]))
            )
        )
        wf = await wait_for_status(engine.stub, task_id)
        assert wf.status == pb.SUCCEEDED, wf.error
        result = state_of(wf)["steps"]["s"]["result"]  # type: ignore[index]
        assert result["target"] == label
        assert result["job_id"] in fleet.jobs_on(node)


async def test_a_node_that_is_not_ready_gets_no_new_jobs(
    engine: RunningEngine, fleet: Fleet, tmp_path: Path
) -> None:
    fleet.not_ready.touch()
    await asyncio.sleep(0.6)  # a few health polls
    task_ids = [new_task_id() for _ in range(6)]
    for task_id in task_ids:
        await engine.stub.StartWorkflow(
            pb.StartWorkflowRequest(
                task_id=task_id,
                task=task(counted("s", tmp_path / "runs", required_labels=["linux"])),
            )
        )
    for task_id in task_ids:
        assert (await wait_for_status(engine.stub, task_id)).status == pb.SUCCEEDED
    assert fleet.jobs_on(fleet.cpu) == set()
    assert len(fleet.jobs_on(fleet.gpu)) == 6


async def test_load_spreads_across_the_nodes(
    settings: Settings, fleet: Fleet, tmp_path: Path
) -> None:
    fleet.write_nodes_file(gpu={"max_jobs": 3}, cpu={"max_jobs": 3})
    replica = await start_engine(with_nodes(settings, fleet, wait_seconds=30))
    try:
        task_ids = [new_task_id() for _ in range(6)]
        for task_id in task_ids:
            spec = task(counted("s", tmp_path / "runs", "sleep 0.5", required_labels=["linux"]))
            await replica.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        for task_id in task_ids:
            assert (await wait_for_status(replica.stub, task_id)).status == pb.SUCCEEDED
    finally:
        await stop_engine(replica)
    assert len(fleet.jobs_on(fleet.gpu)) == 3 and len(fleet.jobs_on(fleet.cpu)) == 3


async def test_a_wrong_token_and_a_body_too_large_are_findings_with_the_nodes_message(
    settings: Settings, fleet: Fleet, tmp_path: Path
) -> None:
    (fleet.root / "gpu.token").write_text("not-the-token")
    replica = await start_engine(with_nodes(settings, fleet))
    try:
        unauthorised = new_task_id()
        await replica.stub.StartWorkflow(
            pb.StartWorkflowRequest(
                task_id=unauthorised,
                task=task(counted("s", tmp_path / "runs", required_labels=["gpu"])),
            )
        )
        too_large = new_task_id()
        big = task(
            shell_step("s", "true", required_labels=["cpu"], env={"BIG": "x" * 30000}),
        )
        await replica.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=too_large, task=big))
        for task_id, code in ((unauthorised, "401"), (too_large, "413")):
            wf = await wait_for_status(replica.stub, task_id)
            assert wf.status == pb.FAILED
            findings = json.dumps(state_of(wf)["steps"]["s"]["verification"])  # type: ignore[index]
            assert f"HTTP {code}" in findings, findings
    finally:
        await stop_engine(replica)
    assert not (tmp_path / "runs").exists()  # neither ran anywhere


async def test_a_node_restarted_mid_job_keeps_the_job(
    engine: RunningEngine, fleet: Fleet, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    task_id = new_task_id()
    await engine.stub.StartWorkflow(
        pb.StartWorkflowRequest(
            task_id=task_id, task=task(counted("s", runs, "sleep 1.5", required_labels=["gpu"]))
        )
    )
    await _until(lambda: runs.exists())
    fleet.gpu.kill()  # kill -9 mid-job: the job runs on, detached
    fleet.gpu.restart()  # same address and data directory, within the retry window
    wf = await wait_for_status(engine.stub, task_id)
    assert wf.status == pb.SUCCEEDED, wf.error
    assert state_of(wf)["attempts_by_step"] == {"s": 1}
    assert runs.read_text().count("run") == 1


async def test_a_node_killed_mid_job_loses_the_attempt_and_the_next_runs_elsewhere(
    engine: RunningEngine, fleet: Fleet, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    task_id = new_task_id()
    fleet.write_nodes_file()
    spec = task(counted("s", runs, "sleep 1", required_labels=["linux"]), max_attempts_per_step=2)
    await engine.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    await _until(lambda: runs.exists())
    (first_job,) = fleet.jobs_on(fleet.gpu) | fleet.jobs_on(fleet.cpu)
    dead, other = (
        (fleet.gpu, fleet.cpu)
        if first_job in fleet.jobs_on(fleet.gpu)
        else (
            fleet.cpu,
            fleet.gpu,
        )
    )
    dead.kill()  # and it never comes back
    wf = await wait_for_status(engine.stub, task_id, timeout=60)
    assert wf.status == pb.SUCCEEDED, wf.error
    assert state_of(wf)["attempts_by_step"] == {"s": 2}
    second_jobs = fleet.jobs_on(other)
    assert first_job not in second_jobs and len(second_jobs) == 1  # a new job id, elsewhere


async def test_a_lost_attempt_is_reported_as_lost(
    engine: RunningEngine, fleet: Fleet, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    task_id = new_task_id()
    spec = task(counted("s", runs, "sleep 1", required_labels=["gpu"]), max_attempts_per_step=1)
    await engine.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    await _until(lambda: runs.exists())
    fleet.gpu.kill()
    wf = await wait_for_status(engine.stub, task_id, timeout=60)
    assert wf.status == pb.FAILED
    step = state_of(wf)["steps"]["s"]  # type: ignore[index]
    assert "was lost" in step["result"]["stderr"] and "gpu" in step["result"]["stderr"]
    assert "was lost" in json.dumps(step["verification"])


async def test_the_engine_killed_mid_job_the_next_one_gets_the_same_job(
    db_url: str, fleet: Fleet, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    runs = tmp_path / "runs"
    task_id = new_task_id()
    spec = task(counted("s", runs, "sleep 2; echo done", required_labels=["gpu"]))
    first = EngineProcess(
        db_url=db_url, data_dir=tmp_path / "a", holder_id="e1", ttl=2, extra_env=fleet.env()
    )
    processes.append(first)
    async with grpc.aio.insecure_channel(first.address) as channel:
        await pb_grpc.WorkflowEngineStub(channel).StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=spec)
        )
    await _until(lambda: runs.exists())
    first.kill()
    second = EngineProcess(
        db_url=db_url, data_dir=tmp_path / "b", holder_id="e2", ttl=2, extra_env=fleet.env()
    )
    processes.append(second)
    async with grpc.aio.insecure_channel(second.address) as channel:
        wf = await wait_for_status(pb_grpc.WorkflowEngineStub(channel), task_id, timeout=60)
    assert wf.status == pb.SUCCEEDED, wf.error
    result = state_of(wf)["steps"]["s"]["result"]  # type: ignore[index]
    assert result["stdout"] == "done\n" and result["target"] == "gpu"
    assert runs.read_text().count("run") == 1
    assert fleet.jobs_on(fleet.gpu) == {result["job_id"]}


async def _until(condition: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.02)


async def test_cancel_stops_the_job_on_our_node(
    engine: RunningEngine, fleet: Fleet, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    sleeper = unique_sleep(30)
    task_id = new_task_id()
    spec = task(
        shell_step("s", f"echo $$ > {pid_file}; exec sleep {sleeper}", required_labels=["gpu"])
    )
    await engine.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    await _until(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
    (pid,) = job_pids(sleeper)
    await engine.stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=task_id, reason="stop"))
    await _until(lambda: not _alive(pid), timeout=10)  # the node stopped its process group
    (job_id,) = fleet.jobs_on(fleet.gpu)
    # The node records the result once the job's process group has ended.
    await _until(lambda: any(fleet.gpu.data_dir.rglob(f"{job_id}/result.json")), timeout=10)
    result = json.loads(next(fleet.gpu.data_dir.rglob(f"{job_id}/result.json")).read_text())
    assert result["status"] == "cancelled"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
