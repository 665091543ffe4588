"""`buf curl` as the API page's "Try it with grpcurl" section spells it, run as written, and
the README's three grpcurl calls, run as a user pastes them.

buf curl speaks the Connect protocol unless told `--protocol grpc`, which grpc.aio does not
serve; docs/api.md's lines must say so, and work. The section's enum note (the `.proto`'s value
names, `SUCCEEDED` and `APPROVE`, not `WORKFLOW_STATUS_SUCCEEDED` or `APPROVED`) must stay true:
both clients refuse the other spellings, naming them. buf comes from `make node-tools`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import RunningEngine
from tests.support.helpers import new_task_id, step, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[2]
BUF = ROOT / "proto" / "node_modules" / ".bin" / "buf"
GRPCURL = Path(sys.executable).parent / "grpcurl"
needs_buf = pytest.mark.skipif(not BUF.exists(), reason="buf missing: run `make node-tools`")
#: The address the docs' examples call (`make run`'s default).
DOCS_ADDRESS = "localhost:50051"


def try_it_section(page: str = "docs/api.md") -> str:
    text = (ROOT / page).read_text()
    start = text.index("\n## Try it with grpcurl\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def readme_script() -> str:
    """The README's "Try it with grpcurl" block: its three calls, as one shell script."""
    section = try_it_section("README.md")
    return section[section.index("```sh\n") + 6 : section.index("\n```", section.index("```sh"))]


def commands(program: str) -> list[str]:
    """The section's shell commands that start with `program`, continuation lines joined."""
    lines = try_it_section().splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.startswith(program):
            command = line
            while command.endswith("\\"):
                i += 1
                command = command[:-1].rstrip() + " " + lines[i].strip()
            found.append(command)
    return found


def buf_curl_lines() -> dict[str, str]:
    """The section's buf curl lines: `list` (--list-methods) and one per method they call."""
    found = {}
    for command in commands("proto/node_modules/.bin/buf curl "):
        if "--list-methods" in command:
            found["list"] = command
        else:
            method = re.search(r"WorkflowEngine/(\w+)$", command)
            assert method is not None, command
            found[method.group(1)] = command
    wanted = {"list", "GetWorkflow", "ListWorkflows"}
    assert wanted <= found.keys(), f"docs/api.md's buf curl lines: {found}, wanted {wanted}"
    return found


async def sh(command: str, address: str, task_id: str) -> tuple[int, str, str]:
    """Run a line of the section as a user would, from the checkout, with `$TASK` set."""
    process = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        command.replace(DOCS_ADDRESS, address),
        cwd=ROOT,
        env={**os.environ, "TASK": task_id, "PATH": f"{GRPCURL.parent}:{os.environ['PATH']}"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def test_the_docs_give_working_buf_curl_lines_next_to_grpcurl() -> None:
    lines = buf_curl_lines()
    for command in lines.values():
        assert "--protocol grpc" in command, command  # the default (Connect) fails
    assert '"SUCCEEDED"' in lines["ListWorkflows"]
    section = try_it_section()
    for spelling in ("SUCCEEDED", "WORKFLOW_STATUS_SUCCEEDED", "APPROVE", "APPROVED"):
        assert spelling in section, spelling


@needs_buf
async def test_the_docs_buf_curl_lines_answer(running: RunningEngine) -> None:
    lines = buf_curl_lines()
    task_id = new_task_id()
    task = pb.TaskSpec(prompt="one step", steps=[step("hi", "echo", "hi")])
    started = await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=task))
    assert started.status == pb.STARTED
    assert (await wait_for_status(running.stub, task_id)).status == pb.SUCCEEDED

    code, out, err = await sh(lines["list"], running.address, task_id)
    assert code == 0, err
    assert "workflow_engine.v1.WorkflowEngine/StartWorkflow" in out.split()

    code, out, err = await sh(lines["GetWorkflow"], running.address, task_id)
    assert code == 0, err
    got = json.loads(out)  # buf curl prints lowerCamelCase
    assert got["taskId"] == task_id and got["status"] == "SUCCEEDED"
    assert got["lastNodeId"] == "finalize_summary"

    code, out, err = await sh(lines["ListWorkflows"], running.address, task_id)
    assert code == 0, err
    listed = {w["taskId"]: w["status"] for w in json.loads(out)["workflows"]}
    assert listed[task_id] == "SUCCEEDED"

    # Without --protocol grpc, buf curl speaks Connect, and the call fails.
    connect = lines["GetWorkflow"].replace("--protocol grpc ", "")
    code, out, err = await sh(connect, running.address, task_id)
    assert code != 0 and out == ""


@needs_buf
async def test_prefixed_or_past_tense_enum_spellings_are_refused_by_name(
    running: RunningEngine,
) -> None:
    lines = buf_curl_lines()
    task_id = new_task_id()
    prefixed = lines["ListWorkflows"].replace('"SUCCEEDED"', '"WORKFLOW_STATUS_SUCCEEDED"')
    code, _, err = await sh(prefixed, running.address, task_id)
    assert code != 0 and 'invalid value for enum field statuses: "WORKFLOW_STATUS_SUCCEEDED"' in err
    url = f"http://{DOCS_ADDRESS}/workflow_engine.v1.WorkflowEngine/ResumeWorkflow"
    approved = json.dumps({"task_id": task_id, "decision": {"step_id": "s", "verdict": "APPROVED"}})
    resume = re.sub(r"--data '.*'", f"--data '{approved}'", lines["GetWorkflow"])
    resume = re.sub(r"http://\S+$", url, resume)
    code, _, err = await sh(resume, running.address, task_id)
    assert code != 0 and 'invalid value for enum field verdict: "APPROVED"' in err

    # grpcurl, the section's other client, refuses them the same way.
    grpcurl = [c for c in commands("grpcurl ") if "ListWorkflows" in c]
    assert grpcurl, "the section's grpcurl ListWorkflows line"
    prefixed = grpcurl[0].replace('"SUCCEEDED"', '"WORKFLOW_STATUS_SUCCEEDED"')
    code, _, err = await sh(prefixed, running.address, task_id)
    assert code != 0
    assert 'does not have value named "WORKFLOW_STATUS_SUCCEEDED"' in err


async def test_the_readme_grpcurl_calls_run_a_workflow(running: RunningEngine) -> None:
    script = readme_script()
    calls = [m for m in ("StartWorkflow", "WatchWorkflow", "GetWorkflow") if m in script]
    assert len(calls) == 3 and script.count("grpcurl -plaintext") == 3, script
    code, out, err = await sh(script, running.address, "")
    assert code == 0, err
    assert '"status": "STARTED"' in out
    # GetWorkflow's answer comes last, an object from a line "{" on; grpcurl prints the
    # .proto's field names.
    got = json.loads(out[out.rindex("\n{\n") :])
    assert got["status"] == "SUCCEEDED" and got["last_node_id"] == "finalize_summary"
