"""The ``job`` verifier: the verification runs as a job on the worker (the Project Analyst
sub-agent in a sandbox), and its verdict is read from the job's result."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path

import pytest
from google.protobuf import json_format

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.helpers import (
    JOB_PYTHON,
    check,
    job_pids,
    new_task_id,
    step,
    task,
    unique_sleep,
    wait_for_status,
)
from workflow_engine.config import Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb

# The analyst: passes a result whose stdout says "ready", and says so in a finding.
ANALYST = """
import json, os, sys
brief = json.loads(os.environ["WORKFLOW_ENGINE_VERIFY_INPUT"])
with open(sys.argv[1], "a") as seen:
    seen.write(brief["step"]["id"] + "\\n")
ready = "ready" in brief["result"]["stdout"]
print("thinking...")
print(json.dumps({
    "status": "pass" if ready else "fail",
    "findings": [{"check": "ready", "passed": ready, "detail": brief["result"]["stdout"][:50]}],
    "recommended_actions": [] if ready else ["print ready"],
}))
"""


@pytest.fixture
async def analysed(settings: Settings, tmp_path: Path) -> AsyncIterator[RunningEngine]:
    script = tmp_path / "analyst.py"
    script.write_text(ANALYST)
    command = f"{JOB_PYTHON} {script} {tmp_path / 'seen.txt'}"
    running = await start_engine(replace(settings, verifier="job", verifier_command=command))
    yield running
    await stop_engine(running)


async def test_the_analysts_verdict_decides_after_the_machine_checks(
    analysed: RunningEngine, tmp_path: Path
) -> None:
    task_id = new_task_id()
    spec = task(
        step("build", "echo", "ready to ship"),
        step("lie", "echo", "not quite", expect=[check("stdout_contains", "quite")]),
        max_attempts_per_step=1,
    )
    await analysed.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    wf = await wait_for_status(analysed.stub, task_id)

    assert wf.status == pb.FAILED
    state = json_format.MessageToDict(wf.state)
    build = state["steps"]["build"]["verification"]
    assert build["status"] == "pass"
    assert {"check": "analyst:ready", "passed": True, "detail": "ready to ship\n"} in build[
        "findings"
    ]
    lie = state["steps"]["lie"]["verification"]
    assert lie["status"] == "fail"  # the machine check passed; the analyst failed it
    assert "print ready" in lie["recommended_actions"]
    assert (tmp_path / "seen.txt").read_text().split() == ["build", "lie"]


async def test_cancel_stops_a_verification_job_that_is_running(
    settings: Settings, tmp_path: Path
) -> None:
    """The verification job goes through the engine's job tracker, so CancelWorkflow stops it
    as it stops the steps' jobs (its whole process group)."""
    pid_file = tmp_path / "analyst.pid"
    sleeper = unique_sleep(30)
    command = f"/bin/sh -c 'echo $$ > {pid_file}; exec sleep {sleeper}'"
    running = await start_engine(replace(settings, verifier="job", verifier_command=command))
    try:
        task_id = new_task_id()
        spec = task(step("build", "echo", "ready"))
        await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        await _until(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
        (pid,) = job_pids(sleeper)
        await running.stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=task_id))
        await _until(lambda: not _alive(pid), timeout=10)
        wf = await wait_for_status(running.stub, task_id)
        assert wf.status == pb.CANCELLED
    finally:
        await stop_engine(running)


async def _until(condition: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False
