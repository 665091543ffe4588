"""An engine or a worker node whose log reader has gone away (its parent died, a log shipper
stopped) still runs every workflow and job to its end: a log line it cannot write is dropped,
never an error in the middle of a node or a job (see `workflow_engine._logs`)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import grpc
import httpx
import pytest

from tests.e2e.node.bodies import run_body
from tests.support.database import engine_env
from tests.support.engine_process import ENGINE
from tests.support.helpers import new_task_id, open_to_jobs, shell_step, task, wait_for_status
from tests.support.node_process import _ROOT, NODE_COMMAND, TOKEN_VARIABLE
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def serve_then_lose_the_reader(
    command: list[str], env: dict[str, str]
) -> tuple[subprocess.Popen[str], str]:
    """Start `command`, read its log until it serves, then close the only reader of its stderr:
    every later write to it fails (EPIPE). Returns the process and the address it serves."""
    env = {
        **env,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
    }
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    for line in process.stderr:
        entry = json.loads(line)
        if entry.get("event") == "serving":
            process.stderr.close()
            return process, str(entry["address"])
    process.wait(10)
    raise AssertionError(f"{command[1]} ended before serving (exit {process.returncode})")


def zombie_children(pid: int) -> list[int]:
    """The children of `pid` that have exited but were not reaped."""
    zombies = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] == "Z" and int(fields[1]) == pid:
            zombies.append(int(stat.parent.name))
    return zombies


async def test_an_engine_whose_stderr_reader_is_gone_still_runs_workflows(
    db_url: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "WORKFLOW_ENGINE_DATABASE_URL": db_url,
        "WORKFLOW_ENGINE_DATA_DIR": str(open_to_jobs(tmp_path / "open") / "data"),
        "WORKFLOW_ENGINE_LISTEN": "127.0.0.1:0",
        "WORKFLOW_ENGINE_PROCESSES": "1",
        **engine_env(db_url),
    }
    engine, address = serve_then_lose_the_reader([str(ENGINE), "serve"], env)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.WorkflowEngineStub(channel)
            task_ids = [new_task_id() for _ in range(3)]
            for task_id in task_ids:
                steps = [shell_step("a", "echo one"), shell_step("b", "echo two")]
                await stub.StartWorkflow(
                    pb.StartWorkflowRequest(task_id=task_id, task=task(*steps))
                )
            for task_id in task_ids:
                workflow = await wait_for_status(stub, task_id)
                assert workflow.status == pb.SUCCEEDED, workflow.error
        assert engine.poll() is None
        assert zombie_children(engine.pid) == []  # each job's wrapper was reaped
    finally:
        engine.kill()
        engine.wait(10)


def test_a_node_whose_stderr_reader_is_gone_still_runs_jobs(tmp_path: Path) -> None:
    command = [str(NODE_COMMAND), "worker-node", "--listen", "127.0.0.1:0"]
    command += ["--data-dir", str(tmp_path / "data")]
    node, address = serve_then_lose_the_reader(command, {**os.environ, TOKEN_VARIABLE: "t"})
    try:
        headers = {"Authorization": "Bearer t"}
        with httpx.Client(base_url=f"http://{address}", headers=headers, timeout=30) as client:
            for i in range(3):
                response = client.post("/v1/worker/jobs:run", json=run_body("echo", f"ran {i}"))
                assert response.status_code == 200, response.text
                assert response.json()["status"] == "completed"
                assert response.json()["stdout"] == f"ran {i}\n"
        assert node.poll() is None
        assert zombie_children(node.pid) == []
    finally:
        node.kill()
        node.wait(10)
