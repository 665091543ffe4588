"""`workflow-engine worker-node` as a client of the Worker API sees it: answers, errors, probes.

One real node process serves the whole module (its jobs are short and each test uses its own
job ids); a test that needs other flags starts its own.
"""

from __future__ import annotations

import asyncio
import re
import socket
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.node.bodies import new_id, run_body
from tests.support.helpers import JOB_PYTHON
from tests.support.node_process import NodeProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

RFC3339_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    process = NodeProcess(
        data_dir=tmp_path_factory.mktemp("node") / "data",
        extra_env={"WORKFLOW_ENGINE_NODE_OUTPUT_BYTES": "1000"},
    )
    yield process
    process.kill()


@pytest.fixture
async def client(node: NodeProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=node.url, headers=node.headers, timeout=30) as c:
        yield c


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    doc: dict[str, Any] = response.json()
    assert doc["status"] == status and doc["title"] and doc["detail"], doc
    return doc


async def test_a_job_runs_and_answers_in_the_worker_api_shape(client: httpx.AsyncClient) -> None:
    task_id, job_id = new_id(), new_id()
    body = run_body("/bin/sh", "-c", "echo out; echo err >&2", task_id=task_id, job_id=job_id)
    body["sba_result"] = {"ignored": True}  # unknown fields are ignored, as by their node
    response = await client.post("/v1/worker/jobs:run", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    result = response.json()
    assert {k: result[k] for k in ("version", "task_id", "job_id", "status", "exit_code")} == {
        "version": 1,
        "task_id": task_id,
        "job_id": job_id,
        "status": "completed",
        "exit_code": 0,  # ours always says it, 0 included (theirs omits a 0)
    }
    assert (result["stdout"], result["stderr"]) == ("out\n", "err\n")
    assert RFC3339_UTC.match(result["started_at"]) and RFC3339_UTC.match(result["ended_at"])
    assert result["started_at"] <= result["ended_at"]
    assert result["truncated"] == {"stdout": False, "stderr": False}
    assert not {"work_dir", "target"} & set(result), "the node's own paths are not the client's"


async def test_a_failed_command_is_a_200_with_its_exit_code(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/worker/jobs:run", json=run_body("/bin/sh", "-c", "exit 3"))
    assert response.status_code == 200
    assert (response.json()["status"], response.json()["exit_code"]) == ("failed", 3)


async def test_output_over_the_limit_is_cut_and_flagged(client: httpx.AsyncClient) -> None:
    script = "head -c 5000 /dev/zero | tr '\\0' x"
    response = await client.post("/v1/worker/jobs:run", json=run_body("/bin/sh", "-c", script))
    result = response.json()
    assert result["truncated"] == {"stdout": True, "stderr": False}
    assert len(result["stdout"]) <= 1000


async def test_the_engine_extras_reach_the_job(client: httpx.AsyncClient) -> None:
    body = run_body("/bin/sh", "-c", 'echo "$WORKFLOW_ENGINE_ATTEMPT $WORKFLOW_ENGINE_REMEDIATION"')
    body |= {"attempt": 2, "remediation": ["exit code was 1"]}
    result = (await client.post("/v1/worker/jobs:run", json=body)).json()
    assert result["stdout"] == '2 ["exit code was 1"]\n'


async def test_a_job_runs_within_its_limits_and_without_network(
    client: httpx.AsyncClient,
) -> None:
    grab = f"x = bytearray({300 * 1024 * 1024})"
    body = run_body(JOB_PYTHON, "-c", grab, limits={"memory_mb": 100})
    result = (await client.post("/v1/worker/jobs:run", json=body)).json()
    assert (result["status"], result["exit_code"]) == ("failed", 1)
    assert "MemoryError" in result["stderr"]
    assert "refused more memory than its limits allow" in result["stderr"]  # the node's note
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        port = listener.getsockname()[1]
        connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)"
        body = run_body(JOB_PYTHON, "-c", connect, network_policy="none")
        result = (await client.post("/v1/worker/jobs:run", json=body)).json()
    assert result["status"] == "failed" and "Network is unreachable" in result["stderr"]


async def test_an_image_is_refused_with_the_reason_and_nothing_runs(
    client: httpx.AsyncClient, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    body = run_body("touch", str(marker), image="python:3.11")
    result = (await client.post("/v1/worker/jobs:run", json=body)).json()
    assert result["status"] == "failed" and result.get("exit_code") is None
    assert "cannot run the image 'python:3.11'" in result["stderr"]
    assert not marker.exists()


@pytest.mark.parametrize(
    ("headers", "detail"),
    [({}, "missing bearer token"), ({"Authorization": "Bearer not-it"}, "wrong bearer token")],
)
async def test_a_missing_or_wrong_token_is_401_and_runs_nothing(
    node: NodeProcess, tmp_path: Path, headers: dict[str, str], detail: str
) -> None:
    marker = tmp_path / "ran"
    body = run_body("/bin/sh", "-c", f"echo ran >> {marker}")
    async with httpx.AsyncClient(base_url=node.url, headers=headers) as anonymous:
        response = await anonymous.post("/v1/worker/jobs:run", json=body)
        doc = assert_problem(response, 401)
        assert detail in doc["detail"]
        assert response.headers["www-authenticate"].startswith("Bearer")
        cancel = await anonymous.post(f"/v1/worker/jobs/{new_id()}:cancel")
        assert_problem(cancel, 401)
    assert not marker.exists()


async def test_a_body_over_10_mib_is_413(client: httpx.AsyncClient, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    body = run_body("/bin/sh", "-c", f"echo ran >> {marker}")
    body["padding"] = "x" * (10 * 1024 * 1024)  # unknown field: only the size is wrong
    doc = assert_problem(await client.post("/v1/worker/jobs:run", json=body), 413)
    assert "10485760" in doc["detail"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it streams
        yield b'{"padding": "'
        for _ in range(11):
            yield b"x" * (1024 * 1024)
        yield b'"}'

    assert_problem(await client.post("/v1/worker/jobs:run", content=chunks()), 413)
    body["padding"] = "x" * (9 * 1024 * 1024)  # under the limit: runs
    ok = await client.post("/v1/worker/jobs:run", json=body)
    assert ok.status_code == 200 and ok.json()["status"] == "completed"
    assert marker.read_text() == "ran\n"


def _bad(**changes: Any) -> dict[str, Any]:
    body = run_body("true")
    for path, value in changes.items():
        target = body
        *parents, leaf = path.split("__")
        for parent in parents:
            target = target[parent]
        if value is _ABSENT:
            del target[leaf]
        else:
            target[leaf] = value
    return body


_ABSENT = object()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (_bad(version=2), "version"),
        (_bad(version="1"), "version"),
        (_bad(version=_ABSENT), "version"),
        (_bad(task_id="task-1"), "task_id"),
        (_bad(job_id="not-a-uuid"), "job_id"),
        (_bad(job_id=7), "job_id"),
        (_bad(sandbox=_ABSENT), "sandbox"),
        (_bad(sandbox__command=[]), "sandbox.command"),
        (_bad(sandbox__command="true"), "sandbox.command"),
        (_bad(sandbox__command=["true", 1]), "sandbox.command[1]"),
        (_bad(sandbox__env={"A": 1}), "sandbox.env.A"),
        (_bad(sandbox__env={"A=B": "1"}), "sandbox.env"),
        (_bad(sandbox__timeout_seconds=-1), "sandbox.timeout_seconds"),
        (_bad(sandbox__timeout_seconds="60"), "sandbox.timeout_seconds"),
        (_bad(sandbox__network_policy="open"), "sandbox.network_policy"),
        (_bad(sandbox__limits={"memory_mb": -1}), "sandbox.limits.memory_mb"),
        ([1, 2], "body"),
    ],
)
async def test_a_bad_request_is_400_naming_the_field(
    client: httpx.AsyncClient, body: Any, field: str
) -> None:
    doc = assert_problem(await client.post("/v1/worker/jobs:run", json=body), 400)
    assert doc["field"] == field, doc
    assert doc["detail"].startswith(f"{field}: "), doc


async def test_a_body_that_is_not_json_is_400(client: httpx.AsyncClient) -> None:
    doc = assert_problem(await client.post("/v1/worker/jobs:run", content=b"{nope"), 400)
    assert doc["field"] == "body"


async def test_health_and_the_not_ready_file(tmp_path: Path) -> None:
    flag = tmp_path / "not-ready"
    node = NodeProcess(data_dir=tmp_path / "data", args=("--not-ready-file", str(flag)))
    try:
        async with httpx.AsyncClient(base_url=node.url) as probe:  # probes carry no token
            assert (await probe.get("/healthz")).status_code == 200
            assert (await probe.get("/readyz")).status_code == 200
            flag.touch()
            assert_problem(await probe.get("/readyz"), 503)
            assert (await probe.get("/healthz")).status_code == 200  # alive, only not ready
            flag.unlink()
            assert (await probe.get("/readyz")).status_code == 200
    finally:
        node.kill()


async def test_an_unknown_path_is_a_problem_document(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/v1/worker/jobs"), 404)
    assert_problem(await client.get("/v1/worker/jobs:run"), 405)
    doc = assert_problem(await client.post("/v1/worker/jobs/nope:cancel"), 400)
    assert doc["field"] == "job_id"


def test_a_second_node_on_the_same_data_dir_is_refused(node: NodeProcess) -> None:
    holder = rf"in use by another worker node \(pid {node.proc.pid}\)"  # names the holder
    with pytest.raises(RuntimeError, match=rf"exit 2.*{holder}"):
        NodeProcess(data_dir=node.data_dir).kill()  # killed, should it start after all
    assert node.alive()


def test_worker_node_without_a_token_does_not_start(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"exit 2.*WORKFLOW_ENGINE_NODE_TOKEN: required"):
        NodeProcess(data_dir=tmp_path / "data", token="").kill()


def test_ids_are_answered_in_canonical_form(node: NodeProcess) -> None:
    job_id = uuid.uuid4()
    body = run_body("true", job_id=str(job_id).upper())
    response = httpx.post(f"{node.url}/v1/worker/jobs:run", json=body, headers=node.headers)
    assert response.json()["job_id"] == str(job_id)


@pytest.mark.timing
async def test_answers_do_not_wait_for_the_clients_delayed_ack(client: httpx.AsyncClient) -> None:
    # Without TCP_NODELAY on the node's connections each answer waited ~40 ms (Nagle against
    # the client's delayed ACK): far above this median on any machine, loaded or not.
    seconds = []
    for _ in range(21):
        started = time.perf_counter()
        assert (await client.get("/healthz")).status_code == 200
        seconds.append(time.perf_counter() - started)
    assert statistics.median(seconds) < 0.02, seconds


async def test_the_node_holds_nothing_of_its_ended_jobs(client: httpx.AsyncClient) -> None:
    """Jobs that completed, failed and were cancelled leave nothing in the node's memory but
    its bounded caches (its census on /healthz, as `tests/e2e/test_held.py` checks an
    engine's)."""
    bodies = [run_body("true"), run_body("/bin/sh", "-c", "exit 3")]
    for body in bodies:
        assert (await client.post("/v1/worker/jobs:run", json=body)).status_code == 200
    long = run_body("/bin/sh", "-c", "sleep 60")
    running = asyncio.create_task(client.post("/v1/worker/jobs:run", json=long))
    await asyncio.sleep(0.5)
    held = (await client.get("/healthz")).json()["held"]
    assert held["node.jobs"]["entries"] == 1  # counted while it runs
    cancel = await client.post(f"/v1/worker/jobs/{long['job_id']}:cancel", json={})
    assert cancel.status_code == 202
    assert (await running).json()["status"] == "cancelled"
    over: dict[str, Any] = {}
    for _ in range(100):
        held = (await client.get("/healthz")).json()["held"]
        over = {k: v for k, v in held.items() if v["entries"] > v["bound"]}
        if not over:
            break
        await asyncio.sleep(0.1)
    assert over == {}
    assert {"node.jobs", "sandbox.watches", "sandbox.users_known"} <= set(held)
