"""The worker node's jobs: once per job_id (restarts included), awaited, cancelled, timed out.

Commands that must run at most once append a line to a marker file outside their work
directory, so a second run would show up as a second line.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.node.bodies import run_body
from tests.support.helpers import job_pids, unique_sleep
from tests.support.node_process import NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

RUN = "/v1/worker/jobs:run"


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def wait_for(path: Path, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.02)


def counted(marker: Path, script: str = "", **sandbox: Any) -> dict[str, Any]:
    """A job that appends to `marker` when it starts, then runs `script`, then prints done."""
    command = f"echo ran >> {marker}; {script or ':'}; echo done"
    return run_body("/bin/sh", "-c", command, **sandbox)


def process_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


async def test_a_repeated_job_id_runs_once_also_after_a_kill_and_restart(
    node: NodeProcess, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    marker = tmp_path / "runs"
    body = counted(marker)
    first = (await client.post(node.url + RUN, json=body)).json()
    assert (first["status"], first["stdout"]) == ("completed", "done\n")
    again = (await client.post(node.url + RUN, json=body)).json()
    assert again == first
    node.kill()  # kill -9: nothing flushed, nothing drained
    node.restart()
    after = (await client.post(node.url + RUN, json=body)).json()
    assert after == first
    assert lines(marker) == ["ran"]


async def test_a_job_id_still_running_is_awaited_not_started_again(
    node: NodeProcess, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    marker = tmp_path / "runs"
    body = counted(marker, "sleep 1")
    first = asyncio.create_task(client.post(node.url + RUN, json=body))
    await wait_for(marker)
    repeats = await asyncio.gather(*(client.post(node.url + RUN, json=body) for _ in range(3)))
    answers = [(await first).json(), *(r.json() for r in repeats)]
    assert all(a == answers[0] for a in answers) and answers[0]["status"] == "completed"
    assert lines(marker) == ["ran"]
    assert node.count("node_job_awaited") >= 1


async def test_a_job_outlives_a_killed_node_and_is_answered_after_restart(
    node: NodeProcess, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    marker = tmp_path / "runs"
    body = counted(marker, "sleep 1.5")
    request = asyncio.create_task(client.post(node.url + RUN, json=body))
    await wait_for(marker)
    node.kill()
    with pytest.raises(httpx.TransportError):
        await request  # the client's connection went with the node
    node.restart()
    result = (await client.post(node.url + RUN, json=body)).json()
    assert (result["status"], result["stdout"]) == ("completed", "done\n")
    assert lines(marker) == ["ran"]


async def test_cancel_stops_a_running_job_and_its_process_group(
    node: NodeProcess, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    sleeper = unique_sleep(60)
    # The shell and a child of it, both in the job's process group; neither ends by itself.
    body = run_body(
        "/bin/sh", "-c", f"sleep {sleeper} & echo $$ $! > {pids}.tmp; mv {pids}.tmp {pids}; wait"
    )
    run = asyncio.create_task(client.post(node.url + RUN, json=body))
    await wait_for(pids)
    shell_and_child = sorted(set(job_pids(str(pids))) | set(job_pids(sleeper)))
    assert len(shell_and_child) == 2
    cancel_url = f"{node.url}/v1/worker/jobs/{body['job_id']}:cancel"
    cancel = await client.post(cancel_url, json={"task_id": body["task_id"]})
    assert cancel.status_code == 202
    assert cancel.json() == {"version": 1, "job_id": body["job_id"], "cancel_requested": True}
    result = (await run).json()
    assert result["status"] == "cancelled" and result["exit_code"] is None, result
    assert all(process_gone(pid) for pid in shell_and_child)
    assert (await client.post(cancel_url)).status_code == 202  # idempotent
    assert (await client.post(node.url + RUN, json=body)).json() == result


async def test_a_job_cancelled_before_it_started_never_starts(
    node: NodeProcess, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    marker = tmp_path / "runs"
    body = counted(marker)
    cancel = await client.post(f"{node.url}/v1/worker/jobs/{body['job_id']}:cancel")
    assert cancel.status_code == 202
    result = (await client.post(node.url + RUN, json=body)).json()
    assert result["status"] == "cancelled"
    assert result["task_id"] == body["task_id"]  # the answer names the request it answers
    assert not marker.exists()


async def test_a_job_over_its_timeout_is_stopped(
    node: NodeProcess, client: httpx.AsyncClient
) -> None:
    started = time.monotonic()
    body = run_body("sleep", "60", timeout_seconds=1)
    result = (await client.post(node.url + RUN, json=body)).json()
    assert result["status"] == "timeout", result
    assert time.monotonic() - started < 15


async def test_a_timeout_over_the_nodes_maximum_is_capped(
    nodes: list[NodeProcess], tmp_path: Path
) -> None:
    nodes.append(NodeProcess(data_dir=tmp_path / "node", args=("--max-timeout-seconds", "1")))
    started = time.monotonic()
    body = run_body("sleep", "60", timeout_seconds=3600)
    async with httpx.AsyncClient(headers=nodes[0].headers, timeout=60) as client:
        response = await client.post(nodes[0].url + RUN, json=body)
    assert response.json()["status"] == "timeout"
    assert time.monotonic() - started < 15


async def test_sigterm_drains_running_jobs_and_refuses_new_ones(
    node: NodeProcess, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    marker = tmp_path / "runs"
    body = counted(marker, "sleep 1.5")
    running = asyncio.create_task(client.post(node.url + RUN, json=body))
    await wait_for(marker)
    os.kill(node.proc.pid, 15)
    node.wait_for_log("node_draining")
    ready = await client.get(node.url + "/readyz")
    assert ready.status_code == 503
    refused = await client.post(node.url + RUN, json=counted(tmp_path / "other"))
    assert refused.status_code == 503 and "draining" in refused.json()["detail"]
    repeat = await client.post(node.url + RUN, json=body)  # the running job is still answered
    result = (await running).json()
    assert result["status"] == "completed" and repeat.json() == result
    assert await asyncio.to_thread(node.proc.wait, 30) == 0
    assert lines(marker) == ["ran"] and not (tmp_path / "other").exists()


async def test_a_job_directory_is_removed_after_its_retention_and_its_id_then_runs_again(
    nodes: list[NodeProcess], tmp_path: Path
) -> None:
    node = NodeProcess(
        data_dir=tmp_path / "node",
        extra_env={"WORKFLOW_ENGINE_NODE_JOB_RETENTION_SECONDS": "3"},
    )
    nodes.append(node)
    marker = tmp_path / "runs"
    body = counted(marker)
    job_dir = tmp_path / "node" / "jobs" / body["job_id"]
    async with httpx.AsyncClient(headers=node.headers, timeout=60) as client:
        first = (await client.post(node.url + RUN, json=body)).json()
        assert first["status"] == "completed" and job_dir.is_dir()
        assert (await client.post(node.url + RUN, json=body)).json() == first  # within it
        pruned = await asyncio.to_thread(node.wait_for_log, "job_dirs_pruned", 15)
        assert pruned["count"] == 1 and not job_dir.exists()
        again = (await client.post(node.url + RUN, json=body)).json()
    assert again["status"] == "completed" and again["started_at"] != first["started_at"]
    assert lines(marker) == ["ran", "ran"]
