"""Secret files as another user of the host meets them (issue 48, finding 13).

The attacker is another user of the host, or a job: run as root, the engine runs each job as a
user of its own. Such a user reads whatever the engine's secret files let group or others read
(a job once read the orchestrator's token from a world-readable tokens file), and rewrites
whatever they let them write. So, as root, `workflow-engine serve` refuses to start on such a
file, naming it and the mode to set; the files `deploy/make-secrets.sh` makes pass.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from structlog.testing import capture_logs

from tests.support.certificates import Authority
from tests.support.database import engine_env
from tests.support.engine_process import ENGINE, EngineProcess, processes_fixture  # noqa: F401
from tests.support.helpers import open_to_jobs
from workflow_engine._masking import MASK, EngineSecrets
from workflow_engine._serving import auth_of, server_credentials
from workflow_engine.api._auth import Callers
from workflow_engine.capabilities.model._client import read_api_key
from workflow_engine.capabilities.workers._nodes_file import load_nodes_file
from workflow_engine.config import LlmSettings, Settings
from workflow_engine.errors import AuthConfigError, CapabilityConfigError, NodesFileError
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

MAKE_SECRETS = Path(__file__).resolve().parents[2] / "deploy" / "make-secrets.sh"
TOKEN = "the-orchestrators-token-0123456789"
NOBODY = 65534

#: Not root, the engine warns instead of refusing (the last test); CI runs the tests as root.
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the engine refuses only as root")


def tokens_file(path: Path, mode: int, *, plaintext: bool = True) -> Path:
    """One orchestrator, named by `TOKEN` itself or only by its SHA-256, in a file of `mode`."""
    entry: dict[str, str] = {"identity": "orchestrator", "role": "orchestrator"}
    if plaintext:
        entry["token"] = TOKEN
    else:
        entry["token_sha256"] = hashlib.sha256(TOKEN.encode()).hexdigest()
    path.write_text(json.dumps({"callers": [entry]}))
    path.chmod(mode)
    return path


def serve_env(db_url: str, tmp_path: Path, **settings: str) -> dict[str, str]:
    return {
        **os.environ,
        **engine_env(db_url),
        "WORKFLOW_ENGINE_DATABASE_URL": db_url,
        "WORKFLOW_ENGINE_DATA_DIR": str(tmp_path / "data"),
        "WORKFLOW_ENGINE_LISTEN": "127.0.0.1:0",
        "WORKFLOW_ENGINE_PROCESSES": "1",
        **{f"WORKFLOW_ENGINE_{name.upper()}": value for name, value in settings.items()},
    }


def refused_start(db_url: str, tmp_path: Path, **settings: str) -> str:
    """`workflow-engine serve` with `settings` exits 2 without serving; what it said."""
    done = subprocess.run(
        [str(ENGINE), "serve"],
        env=serve_env(db_url, tmp_path, **settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert '"serving"' not in done.stderr
    return done.stderr


def serving(db_url: str, tmp_path: Path, **settings: str) -> EngineProcess:
    extra = {f"WORKFLOW_ENGINE_{name.upper()}": value for name, value in settings.items()}
    return EngineProcess(db_url=db_url, data_dir=tmp_path / "data", holder_id="s", extra_env=extra)


async def listed(channel: grpc.aio.Channel) -> pb.ListWorkflowsResponse:
    """ListWorkflows as the orchestrator of `TOKEN`."""
    stub = pb_grpc.WorkflowEngineStub(channel)
    metadata = [("authorization", f"Bearer {TOKEN}")]
    return await stub.ListWorkflows(pb.ListWorkflowsRequest(), metadata=metadata, timeout=10)


@as_root
async def test_a_tokens_file_others_may_read_with_a_plaintext_token_stops_the_start(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    tokens = tokens_file(tmp_path / "tokens.json", 0o644)
    said = refused_start(db_url, tmp_path, tokens_file=str(tokens))
    assert f"WORKFLOW_ENGINE_TOKENS_FILE ({tokens}): readable by its group and others" in said
    assert "(mode 0644)" in said and "plaintext tokens" in said
    assert f"chmod 600 {tokens}" in said

    tokens.chmod(0o600)
    engine = serving(db_url, tmp_path, tokens_file=str(tokens))
    processes.append(engine)
    async with grpc.aio.insecure_channel(engine.address) as channel:
        assert (await listed(channel)).workflows == []


@as_root
@pytest.mark.parametrize(
    ("mode", "plaintext", "what", "fix"),
    [
        (0o640, True, "readable by its group (mode 0640)", "600"),
        (0o604, True, "readable by others (mode 0604)", "600"),
        # Writable: anyone who may could add a caller of their own, hashes or not.
        (0o620, True, "writable by its group (mode 0620)", "600"),
        (0o666, False, "writable by its group and others (mode 0666)", "644"),
    ],
    ids=["640", "604", "620", "666-hashes"],
)
def test_every_mode_that_lets_others_use_the_tokens_file_is_refused(
    tmp_path: Path, mode: int, plaintext: bool, what: str, fix: str
) -> None:
    # What `serve` checks before it starts anything (the test above runs it for real).
    tokens = tokens_file(tmp_path / "tokens.json", mode, plaintext=plaintext)
    with pytest.raises(AuthConfigError) as refused:
        auth_of(Settings(tokens_file=str(tokens)))
    assert str(refused.value).startswith(f"WORKFLOW_ENGINE_TOKENS_FILE ({tokens}): {what}")
    assert f"chmod {fix} {tokens}" in str(refused.value)


@as_root
def test_a_tokens_file_of_hashes_only_may_be_read_by_others(tmp_path: Path) -> None:
    tokens = tokens_file(tmp_path / "tokens.json", 0o644, plaintext=False)
    found = auth_of(Settings(tokens_file=str(tokens)))
    assert found is not None and found.callers is not None
    assert found.callers.by_token(TOKEN) is not None


@as_root
async def test_a_tls_key_others_may_read_stops_the_start(db_url: str, tmp_path: Path) -> None:
    issued = Authority(tmp_path / "pki", "ca").server()
    issued.key.chmod(0o644)
    said = refused_start(
        db_url, tmp_path, tls_cert_file=str(issued.cert), tls_key_file=str(issued.key)
    )
    assert f"WORKFLOW_ENGINE_TLS_KEY_FILE ({issued.key}): readable by its group and others" in said
    assert "(mode 0644)" in said and "private key" in said
    assert f"chmod 600 {issued.key}" in said

    issued.key.chmod(0o640)
    settings = Settings(tls_cert_file=str(issued.cert), tls_key_file=str(issued.key))
    with pytest.raises(AuthConfigError, match=r"readable by its group \(mode 0640\)"):
        server_credentials(settings)
    issued.key.chmod(0o600)
    assert server_credentials(settings) is not None


def make_secrets(out: Path) -> dict[str, int]:
    """Run `deploy/make-secrets.sh` into `out`; the mode of each file it made."""
    subprocess.run(["sh", str(MAKE_SECRETS), str(out)], check=True, capture_output=True)
    return {path.name: path.stat().st_mode & 0o777 for path in out.iterdir()}


@as_root
def test_the_model_key_and_node_token_files_others_may_read_are_refused(tmp_path: Path) -> None:
    key = tmp_path / "llm-key"
    key.write_text("sk-the-models-key\n")
    key.chmod(0o644)
    with pytest.raises(CapabilityConfigError, match=f"chmod 600 {key}") as err:
        read_api_key(LlmSettings(api_key_file=str(key)), EngineSecrets())
    assert f"WORKFLOW_ENGINE_LLM_API_KEY_FILE ({key})" in str(err.value)
    key.chmod(0o600)
    secrets = EngineSecrets()
    assert read_api_key(LlmSettings(api_key_file=str(key)), secrets) == "sk-the-models-key"
    assert secrets.credentials.redact("sk-the-models-key") == MASK

    token = tmp_path / "gpu-1.token"
    token.write_text("the-nodes-token\n")
    token.chmod(0o604)
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(
        yaml.safe_dump(
            [{"name": "gpu-1", "url": "http://127.0.0.1:1", "token_file": "gpu-1.token"}]
        )
    )
    with pytest.raises(NodesFileError, match=f"chmod 600 {token}") as refused:
        load_nodes_file(nodes, {})
    assert "nodes[0] ('gpu-1').token_file" in str(refused.value)
    token.chmod(0o600)
    assert load_nodes_file(nodes, {})[0].token == "the-nodes-token"


async def test_make_secrets_writes_keys_and_tokens_for_their_owner_alone(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    out = tmp_path / "secrets"
    assert make_secrets(out) == {
        "ca.key": 0o600,
        "tls.key": 0o600,
        "node-tls.key": 0o600,
        "orchestrator.token": 0o600,
        "reader.token": 0o600,
        "ca.crt": 0o644,
        "tls.crt": 0o644,
        "node-tls.crt": 0o644,
        "tokens.json": 0o644,  # the tokens' SHA-256 only
    }
    assert out.stat().st_mode & 0o777 == 0o700
    assert "token_sha256" in (out / "tokens.json").read_text()
    assert (out / "orchestrator.token").read_text().strip() not in (out / "tokens.json").read_text()

    # The engine serves with them, as compose and docs/security.md run it.
    engine = serving(
        db_url,
        tmp_path,
        tls_cert_file=str(out / "tls.crt"),
        tls_key_file=str(out / "tls.key"),
        tokens_file=str(out / "tokens.json"),
    )
    processes.append(engine)
    credentials = grpc.ssl_channel_credentials((out / "ca.crt").read_bytes())
    port = engine.address.rsplit(":", 1)[1]
    async with grpc.aio.secure_channel(f"localhost:{port}", credentials) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        token = (out / "orchestrator.token").read_text().strip()
        answer = await stub.ListWorkflows(
            pb.ListWorkflowsRequest(), metadata=[("authorization", f"Bearer {token}")], timeout=10
        )
        assert answer.workflows == []


def as_nobody(call: Callable[[], Any]) -> dict[str, Any]:
    """`call`'s outcome and log lines, run in a child process that became user nobody."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no exit path but os._exit
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with capture_logs() as logs:
                try:
                    outcome: dict[str, Any] = {"returned": repr(call())}
                except Exception as exc:  # reported to the parent
                    outcome = {"raised": repr(exc)}
            outcome["logs"] = [{k: str(v) for k, v in line.items()} for line in logs]
            os.write(write_end, json.dumps(outcome).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    result: dict[str, Any] = json.loads(data)
    return result


@as_root
def test_not_as_root_a_readable_plaintext_tokens_file_is_used_with_a_warning(
    tmp_path: Path,
) -> None:
    # Not root, the engine's jobs run as its own user and read what it reads anyway: it says
    # what is wrong and goes on. As root, the same file stops it.
    tokens = tokens_file(open_to_jobs(tmp_path / "shared") / "tokens.json", 0o644)
    with pytest.raises(AuthConfigError, match=f"chmod 600 {tokens}"):
        Callers.load(str(tokens))

    outcome = as_nobody(lambda: Callers.load(str(tokens)).by_token(TOKEN))
    assert (
        outcome.get("returned") == "Identity(name='orchestrator', role='orchestrator', scope=None)"
    )
    [warning] = [line for line in outcome["logs"] if line["event"] == "secret_file_exposed"]
    assert warning["log_level"] == "warning" and f"chmod 600 {tokens}" in warning["problem"]
