"""The attacker meets `workflow-engine worker-node`: a client that picks another task's job_id.

A node runs each job_id once and answers every later request for it with that run's result,
which is what lets a restarted engine re-attach to its job. Anyone who holds the node's token
(an engine, an orchestrator: for several tenants) chooses the ids it sends, so a job_id alone
must not open another task's job: a request whose job_id the node holds for another task is
refused (409, a problem document), runs nothing, and leaves that job as it was. Every node here
is a real process on a free port.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.node.bodies import new_id, run_body
from tests.node_process import NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

RUN = "/v1/worker/jobs:run"
PROBLEM = "application/problem+json"


@pytest.fixture
def nodes() -> Iterator[list[NodeProcess]]:
    """Node processes a test started; any still alive at the end is killed."""
    started: list[NodeProcess] = []
    yield started
    for node in started:
        node.kill()


@pytest.fixture
def node(nodes: list[NodeProcess], tmp_path: Path) -> NodeProcess:
    nodes.append(NodeProcess(data_dir=tmp_path / "node"))
    return nodes[-1]


@pytest.fixture
async def client(node: NodeProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(headers=node.headers, timeout=60) as c:
        yield c


def victim_job(marker: Path, job_id: str, seconds: float = 0) -> dict[str, Any]:
    """A job of one task that leaves a line in `marker` per run and prints its secret."""
    script = f"echo ran >> {marker}; sleep {seconds}; echo victim-secret-output"
    return run_body("/bin/sh", "-c", script, task_id=new_id(), job_id=job_id)


def as_other_task(body: dict[str, Any], command: str = "echo attacker-ran") -> dict[str, Any]:
    """`body`'s job_id sent for another task (with its own command)."""
    return run_body("/bin/sh", "-c", command, task_id=new_id(), job_id=body["job_id"])


def snapshot(job_dir: Path) -> dict[str, tuple[int, int, bytes]]:
    """Each file of a job directory: its mode, its modification time and its bytes."""
    return {
        str(path.relative_to(job_dir)): (
            path.stat().st_mode,
            path.stat().st_mtime_ns,
            path.read_bytes() if path.is_file() else b"",
        )
        for path in sorted(job_dir.rglob("*"))
    }


def assert_refused(response: httpx.Response) -> dict[str, Any]:
    """409, as a problem document that says why, with nothing of the other job's output."""
    assert response.status_code == 409, response.text
    assert response.headers["content-type"] == PROBLEM
    assert "victim-secret-output" not in response.text
    doc: dict[str, Any] = response.json()
    assert doc["status"] == 409 and doc["title"] == "Conflict", doc
    assert "another task" in doc["detail"] and doc["field"] == "job_id", doc
    return doc


async def wait_for(path: Path, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.02)


async def test_a_finished_jobs_id_sent_for_another_task_is_409_and_the_job_is_untouched(
    node: NodeProcess, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    marker = tmp_path / "victim-runs"
    victim = victim_job(marker, new_id())
    first = (await client.post(node.url + RUN, json=victim)).json()
    assert first["stdout"] == "victim-secret-output\n"
    job_dir = node.data_dir / "jobs" / victim["job_id"]
    before = snapshot(job_dir)
    attacker = tmp_path / "attacker-runs"
    assert_refused(
        await client.post(node.url + RUN, json=as_other_task(victim, f"echo x > {attacker}"))
    )
    assert snapshot(job_dir) == before and not attacker.exists()
    # The task that sent it first still gets its job's result, from the one run.
    again = (await client.post(node.url + RUN, json=victim)).json()
    assert again == first and marker.read_text() == "ran\n"
    assert node.count("node_job_of_another_task") == 1


async def test_a_running_jobs_id_sent_for_another_task_is_409_and_the_job_runs_on(
    node: NodeProcess, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    marker = tmp_path / "victim-runs"
    victim = victim_job(marker, new_id(), seconds=1)
    request = asyncio.create_task(client.post(node.url + RUN, json=victim))
    await wait_for(marker)
    assert_refused(await client.post(node.url + RUN, json=as_other_task(victim)))
    result = (await request).json()
    assert (result["status"], result["stdout"]) == ("completed", "victim-secret-output\n")
    assert result["task_id"] == victim["task_id"] and marker.read_text() == "ran\n"


async def test_after_a_restart_the_job_id_still_belongs_to_its_task(
    node: NodeProcess, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    """The node that started the job is gone (kill -9) while it runs: what the restarted node
    knows of the job's task is on disk."""
    marker = tmp_path / "victim-runs"
    victim = victim_job(marker, new_id(), seconds=1.5)
    request = asyncio.create_task(client.post(node.url + RUN, json=victim))
    await wait_for(marker)
    node.kill()
    with pytest.raises(httpx.TransportError):
        await request
    node.restart()
    assert_refused(await client.post(node.url + RUN, json=as_other_task(victim)))
    result = (await client.post(node.url + RUN, json=victim)).json()
    assert (result["status"], result["stdout"]) == ("completed", "victim-secret-output\n")
    assert marker.read_text() == "ran\n"


async def test_another_task_cannot_cancel_a_job_and_its_own_task_can(
    node: NodeProcess, client: httpx.AsyncClient, tmp_path: Path
) -> None:
    marker = tmp_path / "victim-runs"
    victim = victim_job(marker, new_id(), seconds=1)
    request = asyncio.create_task(client.post(node.url + RUN, json=victim))
    await wait_for(marker)
    cancel = f"{node.url}/v1/worker/jobs/{victim['job_id']}:cancel"
    assert_refused(await client.post(cancel, json={"task_id": new_id()}))
    result = (await request).json()
    assert (result["status"], result["stdout"]) == ("completed", "victim-secret-output\n")
    # A job cancelled before it started belongs to the task its cancel named.
    early = victim_job(tmp_path / "never", new_id())
    cancel = f"{node.url}/v1/worker/jobs/{early['job_id']}:cancel"
    assert (await client.post(cancel, json={"task_id": early["task_id"]})).status_code == 202
    assert_refused(await client.post(node.url + RUN, json=as_other_task(early)))
    own = (await client.post(node.url + RUN, json=early)).json()
    assert own["status"] == "cancelled" and not (tmp_path / "never").exists()
