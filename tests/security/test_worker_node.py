"""The attackers of `workflow-engine worker-node` and of the engine's link to it.

Anyone on the network between an engine and its node reads what crosses it in clear: the
node's bearer token (which runs any command on the node) and every job's command, environment
and output. So a node serves plaintext beyond loopback only when told the network is trusted
(``WORKFLOW_ENGINE_NODE_ALLOW_PLAINTEXT_REMOTE``), otherwise HTTPS with its certificate; and
the engine sends nothing to an ``http://`` node beyond loopback unless told the same
(``WORKFLOW_ENGINE_NODES_ALLOW_PLAINTEXT_REMOTE``), and checks an ``https://`` node's
certificate against the CA it is given (``WORKFLOW_ENGINE_NODES_CA_FILE``) before its token
goes out.

A node runs each job_id once and answers every later request for it with that run's result,
which is what lets a restarted engine re-attach to its job. Anyone who holds the node's token
(an engine, an orchestrator: for several tenants) chooses the ids it sends, so a job_id alone
must not open another task's job: a request whose job_id the node holds for another task is
refused (409, a problem document), runs nothing, and leaves that job as it was.

Every node here is a real process on a free port, every engine a real one over real HTTP and
TLS, with a CA and certificates the test makes.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import stat
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from google.protobuf import json_format

from tests.conftest import start_engine, stop_engine
from tests.e2e.node.bodies import new_id, run_body
from tests.support.certificates import Authority
from tests.support.helpers import check, new_task_id, step, task, wait_for_status, write_secret
from tests.support.node_process import NodeProcess
from workflow_engine.config import NodesSettings, Settings
from workflow_engine.errors import CapabilityConfigError
from workflow_engine.v1 import workflow_engine_pb2 as pb

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

RUN = "/v1/worker/jobs:run"
PROBLEM = "application/problem+json"
NODE_ALLOW_PLAINTEXT = "WORKFLOW_ENGINE_NODE_ALLOW_PLAINTEXT_REMOTE"
NODES_ALLOW_PLAINTEXT = "WORKFLOW_ENGINE_NODES_ALLOW_PLAINTEXT_REMOTE"
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def this_hosts_address() -> str:
    """An address of this host other than loopback (the one its route out starts from; a UDP
    connect sends nothing), or its name when it has no route."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only the route is looked up
            address = str(probe.getsockname()[0])
        except OSError:
            return socket.gethostname()
    return address if not address.startswith("127.") else socket.gethostname()


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


@pytest.mark.parametrize("host", ["0.0.0.0", "", this_hosts_address()])
def test_a_node_beyond_loopback_without_tls_does_not_start(tmp_path: Path, host: str) -> None:
    refusal = rf"exit 2.*NODE_LISTEN={host}:0 is reachable from other hosts.*{NODE_ALLOW_PLAINTEXT}"
    with pytest.raises(RuntimeError, match=refusal):
        NodeProcess(data_dir=tmp_path / "node", listen=f"{host}:0").kill()


def test_a_node_told_the_network_is_trusted_serves_plaintext_and_logs_it(
    nodes: list[NodeProcess], tmp_path: Path
) -> None:
    node = NodeProcess(
        data_dir=tmp_path / "node", listen="0.0.0.0:0", extra_env={NODE_ALLOW_PLAINTEXT: "true"}
    )
    nodes.append(node)
    said = node.wait_for_log("node_serving_plaintext_remote")
    assert said["level"] == "warning" and said["allowed_by"] == NODE_ALLOW_PLAINTEXT
    assert httpx.get(f"http://127.0.0.1:{node.port}/healthz").status_code == 200
    # On loopback, as by default, there is nothing to say.
    local = NodeProcess(data_dir=tmp_path / "local")
    nodes.append(local)
    assert local.count("node_serving_plaintext_remote") == 0


def nodes_file(tmp_path: Path, name: str, url: str, token: str) -> Path:
    """A nodes file of one node, its token in a file beside it."""
    write_secret(tmp_path / f"{name}.token", token)
    path = tmp_path / "nodes.json"
    entry = {"name": name, "url": url, "token_file": f"{name}.token", "labels": [name]}
    path.write_text(json.dumps([entry]))
    return path


def with_nodes(settings: Settings, path: Path, **nodes: Any) -> Settings:
    options = {"health_interval_seconds": 0.2, "wait_seconds": 10.0, "retry_seconds": 2.0}
    return replace(
        settings, worker="nodes", nodes=NodesSettings(file=str(path), **{**options, **nodes})
    )


async def run_one_job(settings: Settings, node: NodeProcess, name: str) -> None:
    """Start an engine with `settings`, run a one-step workflow: it succeeds on `node`."""
    running = await start_engine(settings)
    try:
        task_id = new_task_id()
        spec = task(step("hello", "echo", "hello node", expect=[check("stdout_contains", "hello")]))
        await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        workflow = await wait_for_status(running.stub, task_id)
    finally:
        await stop_engine(running)
    assert workflow.status == pb.SUCCEEDED, workflow.error
    job = json_format.MessageToDict(workflow.state)["steps"]["hello"]["job"]
    assert job["target"] == name
    assert (node.data_dir / "jobs" / job["request"]["job_id"] / "result.json").is_file()


async def test_a_node_with_tls_serves_https_only_and_the_engine_trusts_its_ca(
    settings: Settings, nodes: list[NodeProcess], tmp_path: Path
) -> None:
    ca = Authority(tmp_path / "pki", "node-ca")
    issued = ca.server()  # for localhost and 127.0.0.1
    node = NodeProcess(
        data_dir=tmp_path / "node",
        listen="0.0.0.0:0",  # beyond loopback: TLS is what makes that allowed
        extra_env={
            "WORKFLOW_ENGINE_NODE_TLS_CERT_FILE": str(issued.cert),
            "WORKFLOW_ENGINE_NODE_TLS_KEY_FILE": str(issued.key),
        },
    )
    nodes.append(node)
    assert node.url.startswith("https://") and node.count("node_serving_plaintext_remote") == 0
    url = f"https://localhost:{node.port}"
    # Plaintext gets no answer at all, and runs nothing.
    marker = tmp_path / "plaintext-ran"
    body = run_body("/bin/sh", "-c", f"echo ran > {marker}")
    async with httpx.AsyncClient(headers=node.headers, timeout=10) as plain:
        with pytest.raises(httpx.TransportError):
            await plain.post(f"http://127.0.0.1:{node.port}{RUN}", json=body)
        # A client that does not trust the node's CA does not get as far as sending its token.
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await plain.post(f"{url}{RUN}", json=body)
    trust = ssl.create_default_context(cafile=ca.issued.cert)
    async with httpx.AsyncClient(verify=trust, timeout=10) as trusting:
        assert (await trusting.get(f"{url}/readyz")).status_code == 200
    path = nodes_file(tmp_path, "tls-node", url, node.token)
    await run_one_job(with_nodes(settings, path, ca_file=str(ca.issued.cert)), node, "tls-node")
    assert not marker.exists()


async def test_the_engine_sends_nothing_in_clear_beyond_loopback_unless_told_the_network_is_trusted(
    settings: Settings, nodes: list[NodeProcess], tmp_path: Path
) -> None:
    node = NodeProcess(
        data_dir=tmp_path / "node", listen="0.0.0.0:0", extra_env={NODE_ALLOW_PLAINTEXT: "true"}
    )
    nodes.append(node)
    url = f"http://{this_hosts_address()}:{node.port}"
    path = nodes_file(tmp_path, "remote-1", url, node.token)
    with pytest.raises(CapabilityConfigError) as refused:
        await stop_engine(
            await start_engine(with_nodes(settings, path))
        )  # stopped, should it start
    message = str(refused.value)
    assert f"nodes[0] ('remote-1').url: {url} is plaintext HTTP to another host" in message
    assert f"{NODES_ALLOW_PLAINTEXT}=true" in message
    assert node.count("node_job_result") == 0 and not (node.data_dir / "jobs").exists()
    # Told the network is trusted, it sends the job there.
    await run_one_job(with_nodes(settings, path, allow_plaintext_remote=True), node, "remote-1")


def test_the_development_secrets_keep_keys_private_and_the_deployed_node_serves_with_them(
    nodes: list[NodeProcess], tmp_path: Path
) -> None:
    """`deploy/make-secrets.sh` writes every key and token for its owner only, and a node with
    its certificate passes compose's own healthcheck (pointed at these files and this port)."""
    secrets = tmp_path / "secrets"
    made = subprocess.run(
        ["sh", str(DEPLOY / "make-secrets.sh"), str(secrets)], capture_output=True, check=False
    )
    assert made.returncode == 0, made.stderr
    for name in ("ca.key", "tls.key", "node-tls.key", "orchestrator.token", "reader.token"):
        assert stat.S_IMODE((secrets / name).stat().st_mode) == 0o600, name
    node = NodeProcess(
        data_dir=tmp_path / "node",
        listen="0.0.0.0:0",
        extra_env={
            "WORKFLOW_ENGINE_NODE_TLS_CERT_FILE": str(secrets / "node-tls.crt"),
            "WORKFLOW_ENGINE_NODE_TLS_KEY_FILE": str(secrets / "node-tls.key"),
        },
    )
    nodes.append(node)
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    check_command = compose["services"]["worker-node-1"]["healthcheck"]["test"]
    assert check_command[:3] == ["CMD", "python", "-c"]
    code = check_command[3].replace("/run/secrets/", f"{secrets}/")
    code = code.replace(":8090/", f":{node.port}/")
    healthcheck = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=30, check=False
    )
    assert healthcheck.returncode == 0, healthcheck.stderr


def test_a_stranger_cannot_hold_the_nodes_connections(tmp_path: Path) -> None:
    """Issue 61's own round (finding e). Attacker: anyone who can reach the node's port, with
    no token. uvicorn timed only the idle time after an answer: a connection that sent nothing,
    or a request line and then a header byte now and then, was held for ever, and connections
    were taken without limit, so a stranger could take every descriptor the node has (and its
    jobs could then open no file). Now a connection beyond the cap is closed as it is made,
    and one that has not sent a whole request head in time is closed; a client with a token is
    answered meanwhile."""
    node = NodeProcess(
        data_dir=tmp_path / "node",
        extra_env={
            "WORKFLOW_ENGINE_NODE_MAX_CONNECTIONS": "8",
            "WORKFLOW_ENGINE_NODE_HEAD_TIMEOUT_SECONDS": "1",
        },
    )
    try:
        host, port = node.address.rsplit(":", 1)
        silent = [socket.create_connection((host, int(port)), timeout=10) for _ in range(8)]
        dribbling = silent[0]
        dribbling.sendall(b"POST " + RUN.encode() + b" HTTP/1.1\r\nHost: n\r\n")
        # Beyond the cap: closed at once, nothing read from it.
        with socket.create_connection((host, int(port)), timeout=10) as extra:
            assert extra.recv(1) == b""
        # Within the head timeout's reach: every held connection is closed, the dribbling one
        # too (a header byte a while does not keep it).
        started = time.monotonic()
        for _ in range(3):
            time.sleep(0.4)
            dribbling.sendall(b"X")
        for held in silent:
            assert held.recv(1) == b""
            held.close()
        assert time.monotonic() - started < 8
        # The node answers as before, a job that runs past the head timeout included.
        answer = httpx.post(
            node.url + RUN, json=run_body("sleep", "2"), headers=node.headers, timeout=30
        )
        assert (answer.status_code, answer.json()["status"]) == (200, "completed")
    finally:
        node.kill()


def test_a_stranger_cannot_hold_a_tls_nodes_connections_in_the_handshake(
    tmp_path: Path,
) -> None:
    """Found by issue 61's own round: under TLS a connection meets the node's bounds only once
    its handshake is done, and uvicorn left the handshake to asyncio's default of 60 s, so a
    stranger who connected and never spoke TLS held a descriptor that long, as many times as
    it liked. The handshake now has the head's time (NODE_HEAD_TIMEOUT_SECONDS)."""
    issued = Authority(tmp_path / "pki", "node-ca").server()
    node = NodeProcess(
        data_dir=tmp_path / "node",
        extra_env={
            "WORKFLOW_ENGINE_NODE_TLS_CERT_FILE": str(issued.cert),
            "WORKFLOW_ENGINE_NODE_TLS_KEY_FILE": str(issued.key),
            "WORKFLOW_ENGINE_NODE_HEAD_TIMEOUT_SECONDS": "1",
        },
    )
    try:
        host, port = node.address.rsplit(":", 1)
        silent = [socket.create_connection((host, int(port)), timeout=10) for _ in range(20)]
        started = time.monotonic()
        for held in silent:
            assert held.recv(1) == b""  # closed by the node
            held.close()
        assert time.monotonic() - started < 8
    finally:
        node.kill()
