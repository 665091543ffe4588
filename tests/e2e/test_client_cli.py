"""`workflow-engine start|get|watch|list|cancel|approve|reject|update` as a person uses them.

Each command is the real `workflow-engine` process, against a real engine on a free port;
what a script relies on is checked exactly: exit codes, `--json` documents, messages on
stderr that name the field.
"""

from __future__ import annotations

import asyncio
import json
import os
import pty
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.integration.api.test_auth import TOKENS, write_tokens
from tests.support.certificates import Authority
from workflow_engine.config import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

PASSING = """\
prompt: Check the tools and report
steps:
  - id: hello
    command: [sh, -c, "echo hello"]
    expect: [{kind: stdout_contains, value: hello}]
  - id: count
    command: [seq, "3"]
"""
NEEDS_APPROVAL = {
    "prompt": "deploy",
    "steps": [
        {"id": "build", "command": ["true"]},
        {"id": "deploy", "command": ["echo", "deploying"], "requires_approval": True},
    ],
}


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


async def cli(address: str, *args: str, stdin: str = "", env: dict[str, str] | None = None) -> Ran:
    """`workflow-engine ARGS --address ADDRESS`, as its own process."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workflow_engine",
        *args,
        "--address",
        address,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await asyncio.wait_for(process.communicate(stdin.encode()), 60)
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


async def test_start_waits_live_and_exits_with_how_the_workflow_ended(
    running: RunningEngine, tmp_path: Path
) -> None:
    task_file = tmp_path / "task.yaml"
    task_file.write_text(PASSING)
    passed = await cli(running.address, "start", str(task_file), "--wait")
    assert passed.code == 0, passed.err
    assert "verify_step_result  hello: passed" in passed.out
    assert "SUCCEEDED" in passed.out and "All 2 step(s) passed" in passed.out

    failing = {"steps": [{"id": "boom", "command": ["sh", "-c", "exit 3"]}]}
    failing["max_attempts_per_step"] = 1
    failed = await cli(running.address, "start", "-", "--wait", stdin=json.dumps(failing))
    assert failed.code == 1, failed.err
    assert "FAILED" in failed.out and "expected exit code 0, got 3" in failed.out


async def test_json_output_is_the_contracts_own(running: RunningEngine) -> None:
    started = await cli(running.address, "start", "-", "--json", stdin=PASSING)
    assert started.code == 0, started.err
    answer = started.json()
    assert answer["status"] == "STARTED" and answer["workflow_status"] == "RUNNING"
    task_id = answer["task_id"]

    watched = await cli(running.address, "watch", task_id, "--json")
    assert watched.code == 0, watched.err
    *events, final = [json.loads(line) for line in watched.out.splitlines()]
    assert [e["sequence"] for e in events] == [str(n) for n in range(1, len(events) + 1)]
    assert events[-1]["status"] == "SUCCEEDED" and final["status"] == "SUCCEEDED"

    got = await cli(running.address, "get", task_id, "--json")
    assert got.json()["state"]["steps"]["count"]["result"]["stdout"] == "1\n2\n3\n"
    listed = await cli(running.address, "list", "--status", "succeeded", "--json")
    assert task_id in {w["task_id"] for w in listed.json()}
    human = await cli(running.address, "list", "--limit", "1")
    assert task_id in human.out and "SUCCEEDED" in human.out


async def test_approve_and_reject_what_a_workflow_waits_on(running: RunningEngine) -> None:
    waiting = await cli(running.address, "start", "-", "--wait", stdin=json.dumps(NEEDS_APPROVAL))
    assert waiting.code == 4, waiting.err  # it waits: watch stops and says how to go on
    assert "waiting for approval of step deploy" in waiting.out
    task_id = next(line.split()[0] for line in waiting.out.splitlines() if "WAITING" in line)
    assert f"workflow-engine approve {task_id}" in waiting.out

    approved = await cli(running.address, "approve", task_id, "--reason", "window open")
    assert approved.code == 0, approved.err
    assert "approved step deploy" in approved.out
    assert (await cli(running.address, "watch", task_id)).code == 0
    history = await cli(running.address, "get", task_id, "--history")
    assert "approve step deploy: window open" in history.out

    other = await cli(running.address, "start", "-", "--json", stdin=json.dumps(NEEDS_APPROVAL))
    other_id = other.json()["task_id"]
    assert (await cli(running.address, "watch", other_id)).code == 4
    refused = await cli(running.address, "reject", other_id)
    assert refused.code == 2 and "--reason" in refused.err  # a reject needs its reason
    rejected = await cli(running.address, "reject", other_id, "--reason", "not today")
    assert rejected.code == 0, rejected.err
    ended = await cli(running.address, "watch", other_id)
    assert ended.code == 1 and "not today" in ended.out


async def test_cancel_and_an_operators_override(running: RunningEngine) -> None:
    slow = await cli(running.address, "start", "--prompt", "$ sleep 30", "--json")
    task_id = slow.json()["task_id"]
    cancelled = await cli(running.address, "cancel", task_id, "--reason", "not needed")
    assert cancelled.code == 0 and "CANCELLED" in cancelled.out
    assert (await cli(running.address, "get", task_id)).code == 3

    waiting = await cli(running.address, "start", "-", "--json", stdin=json.dumps(NEEDS_APPROVAL))
    task_id = waiting.json()["task_id"]
    assert (await cli(running.address, "watch", task_id)).code == 4
    forced = await cli(
        running.address, "update", task_id, "--force-branch", "mark_failed", "--reason", "stop"
    )
    assert forced.code == 0, forced.err
    assert (await cli(running.address, "watch", task_id)).code == 1
    ended = await cli(running.address, "update", task_id, "--reject-last-result")
    assert ended.code == 2 and "FAILED_PRECONDITION" in ended.err


async def test_errors_say_what_is_wrong_and_exit_with_their_code(
    running: RunningEngine, tmp_path: Path
) -> None:
    unknown = await cli(running.address, "get", "00000000-0000-4000-8000-000000000000")
    assert unknown.code == 6 and "NOT_FOUND" in unknown.err
    malformed = await cli(running.address, "get", "nope")
    assert malformed.code == 2 and "task_id: not a UUID" in malformed.err
    empty_argv = json.dumps({"steps": [{"id": "a", "command": []}]})
    refused = await cli(running.address, "start", "-", stdin=empty_argv)
    assert refused.code == 2 and "task.steps[0].command" in refused.err
    typo = await cli(running.address, "start", "-", stdin="stepz: []")
    assert typo.code == 2 and 'no field named "stepz"' in typo.err
    missing = await cli(running.address, "start", str(tmp_path / "none.yaml"))
    assert missing.code == 2 and "cannot read" in missing.err
    nothing = await cli(running.address, "start")
    assert nothing.code == 2 and "give a task file" in nothing.err
    unreachable = await cli("127.0.0.1:1", "list")
    assert unreachable.code == 8 and "cannot reach the engine at 127.0.0.1:1" in unreachable.err
    # Nothing was started by any of them.
    assert (await cli(running.address, "list", "--json")).json() == []


async def test_tokens_and_tls_reach_a_guarded_engine(settings: Settings, tmp_path: Path) -> None:
    ca = Authority(tmp_path / "pki", "our-ca")
    server = ca.server()
    guarded = replace(
        settings,
        tls_cert_file=str(server.cert),
        tls_key_file=str(server.key),
        tokens_file=str(write_tokens(tmp_path / "tokens.json")),
    )
    running = await start_engine(guarded)
    try:
        address = f"localhost:{running.address.rsplit(':', 1)[1]}"
        tls = ("--ca-file", str(ca.issued.cert))
        plaintext = await cli(address, "list")
        assert plaintext.code == 8  # a TLS port does not answer plaintext
        anonymous = await cli(address, "list", *tls)
        assert anonymous.code == 7 and "UNAUTHENTICATED" in anonymous.err
        token = {"WORKFLOW_ENGINE_CLIENT_TOKEN": TOKENS["reader"]}
        assert (await cli(address, "list", *tls, env=token)).code == 0
        reader_start = await cli(address, "start", "--prompt", "$ true", *tls, env=token)
        assert reader_start.code == 7 and "PERMISSION_DENIED" in reader_start.err
        token_file = tmp_path / "token"
        token_file.write_text(TOKENS["orchestrator"] + "\n")
        started = await cli(
            address,
            "start",
            "-",
            "--json",
            *tls,
            "--token-file",
            str(token_file),
            stdin=json.dumps(NEEDS_APPROVAL),
        )
        assert started.code == 0, started.err
        task_id = started.json()["task_id"]
        operator = {"WORKFLOW_ENGINE_CLIENT_TOKEN": TOKENS["operator"]}
        assert (await cli(address, "watch", task_id, *tls, env=operator)).code == 4
        assert (await cli(address, "approve", task_id, *tls, env=operator)).code == 0
        history = await cli(address, "get", task_id, "--history", "--json", *tls, env=operator)
        [decided] = [e for e in history.json()["history"] if e["kind"] == "APPROVAL_DECIDED"]
        assert decided["actor"].startswith("alice")  # the token's identity, not the login name
    finally:
        await stop_engine(running)


async def test_watch_in_a_terminal_shows_a_bar_of_steps_passed(
    running: RunningEngine, tmp_path: Path
) -> None:
    started = await cli(running.address, "start", "-", "--json", stdin=PASSING)
    task_id = started.json()["task_id"]
    controller, terminal = pty.openpty()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workflow_engine",
        "watch",
        task_id,
        "--address",
        running.address,
        stdout=terminal,
        stderr=terminal,
        env={**os.environ, "COLUMNS": "100"},
    )
    os.close(terminal)
    screen = bytearray()
    loop = asyncio.get_running_loop()
    while True:
        try:
            chunk = await loop.run_in_executor(None, os.read, controller, 65536)
        except OSError:  # the process closed the terminal
            break
        if not chunk:
            break
        screen += chunk
    os.close(controller)
    assert await process.wait() == 0
    shown = screen.decode(errors="replace")
    assert "2/2" in shown and "steps" in shown  # the bar, at its end
    assert "\x1b[" in shown  # in colour: it knows it is a terminal
