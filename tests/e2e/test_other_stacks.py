"""Clients in other stacks, from the .proto alone: the Node and Go examples of docs/api.md and
`buf curl`.

They run against a real engine on a free port with the tooling `make test` installs: Node's
(`make node-tools`: buf, @grpc/grpc-js, @grpc/proto-loader, pinned by
proto/package-lock.json) and Go's (`make go-tools`: Debian's Go, protoc and grpc-go, built in
GOPATH mode since no module proxy is reachable).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import RunningEngine
from tests.support.helpers import new_task_id, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

PROTO = Path(__file__).resolve().parents[2] / "proto"
NODE = shutil.which("node")
BUF = PROTO / "node_modules" / ".bin" / "buf"
needs_tools = pytest.mark.skipif(
    NODE is None or not BUF.exists(), reason="Node tooling missing: run `make node-tools`"
)
GO, PROTOC = shutil.which("go"), shutil.which("protoc")
needs_go = pytest.mark.skipif(
    GO is None or PROTOC is None, reason="Go tooling missing: run `make go-tools`"
)
#: Where the example imports the generated code from (docs/api.md, "Clients in other stacks").
GO_IMPORT = "example.com/workflowengine/v1"


async def run(
    *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=cwd, env=env
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@needs_tools
async def test_the_node_example_starts_watches_and_reads_a_workflow(
    running: RunningEngine,
) -> None:
    assert NODE is not None
    code, out, err = await run(NODE, str(PROTO / "examples/node/client.mjs"), running.address)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("started ") and lines[0].endswith("STARTED, workflow RUNNING")
    assert "#6 NODE_COMPLETED verify_step_result count: passed" in lines
    assert json.loads(lines[-1]) == {
        "status": "SUCCEEDED",
        "outputs": {"count": '{"count": 3, "unit": "steps"}'},
        "preferences_effective": {"style": {"verbose": False}},
    }


@needs_tools
async def test_buf_curl_calls_the_engine_through_reflection(running: RunningEngine) -> None:
    task_id = new_task_id()
    flags = ("--protocol", "grpc", "--http2-prior-knowledge")
    url = f"http://{running.address}/workflow_engine.v1.WorkflowEngine"
    body = {"task_id": task_id, "task": {"steps": [{"id": "hi", "command": ["echo", "hi"]}]}}
    code, out, err = await run(
        str(BUF), "curl", *flags, "--data", json.dumps(body), f"{url}/StartWorkflow"
    )
    assert code == 0, err
    assert json.loads(out)["status"] == "STARTED"
    assert (await wait_for_status(running.stub, task_id)).status == pb.SUCCEEDED
    bad = json.dumps({"task_id": "nope"})
    code, _, err = await run(str(BUF), "curl", *flags, "--data", bad, f"{url}/GetWorkflow")
    assert code != 0  # buf curl writes the error status to stderr
    assert json.loads(err) == {"code": "invalid_argument", "message": "task_id: not a UUID: 'nope'"}


@needs_go
async def test_the_go_example_builds_from_the_proto_and_runs_a_workflow(
    running: RunningEngine, tmp_path: Path
) -> None:
    assert GO is not None and PROTOC is not None
    gopath = tmp_path / "gopath"
    (gopath / "src" / "example.com" / "client").mkdir(parents=True)
    mapping = f"Mworkflow_engine/v1/workflow_engine.proto={GO_IMPORT}"
    code, _, err = await run(
        PROTOC,
        f"-I{PROTO}",
        f"--go_out={gopath / 'src'}",
        f"--go-grpc_out={gopath / 'src'}",
        f"--go_opt={mapping}",
        f"--go-grpc_opt={mapping}",
        str(PROTO / "workflow_engine/v1/workflow_engine.proto"),
    )
    assert code == 0, err
    client = gopath / "src" / "example.com" / "client"
    shutil.copy(PROTO / "examples/go/main.go", client)
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": f"{gopath}:/usr/share/gocode",
        "GOFLAGS": "",
    }
    code, _, err = await run(GO, "build", "-o", str(tmp_path / "client"), ".", cwd=client, env=env)
    assert code == 0, err
    code, out, err = await run(str(tmp_path / "client"), running.address)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].endswith("STARTED, workflow RUNNING")
    assert "#6 NODE_COMPLETED verify_step_result count: passed" in lines
    assert json.loads(lines[-1]) == {"status": "SUCCEEDED", "stdout": '{"count": 3}\n'}
