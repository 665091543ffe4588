"""A tenant's checks cannot stall the engine or read the host's files.

The attacker is a tenant, or a model writing steps: it writes a step's `expect` checks and the
command whose output and files they judge. A pattern that backtracks over the job's output must
not hold the event loop (health and every other workflow wait on it); a path must not ask the
engine, running as root, about a file of the host, directly or through a link the job plants.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import RunningEngine
from tests.security.conftest import as_caller, tenant_task
from tests.support.helpers import (
    JOB_PYTHON,
    TERMINAL,
    check,
    new_task_id,
    shell_step,
    step,
    wait_for_status,
)
from workflow_engine.v1 import workflow_engine_pb2 as pb

TENANT = as_caller("a-orchestrator")
#: Enough `a`s that Python's backtracking `re` would take longer than the universe has left.
AS = 5000


async def start(served: RunningEngine, *steps: pb.Step) -> str:
    spec = tenant_task("project-a", *steps)
    spec.max_attempts_per_step = 1
    task_id = new_task_id()
    request = pb.StartWorkflowRequest(task_id=task_id, task=spec)
    await served.stub.StartWorkflow(request, metadata=TENANT)
    return task_id


async def refused(served: RunningEngine, *steps: pb.Step) -> grpc.aio.AioRpcError:
    """The error StartWorkflow answers for a task of `steps`, after checking nothing is stored."""
    task_id = new_task_id()
    request = pb.StartWorkflowRequest(task_id=task_id, task=tenant_task("project-a", *steps))
    with pytest.raises(grpc.aio.AioRpcError) as refusal:
        await served.stub.StartWorkflow(request, metadata=TENANT)
    with pytest.raises(grpc.aio.AioRpcError) as lookup:
        await served.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id), metadata=TENANT)
    assert lookup.value.code() == grpc.StatusCode.NOT_FOUND
    return refusal.value


def findings(workflow: pb.Workflow, step_id: str) -> list[dict[str, Any]]:
    state = json_format.MessageToDict(workflow.state)
    found: list[dict[str, Any]] = state["steps"][step_id]["verification"]["findings"]
    return found


#: The probe's pause between rounds.
PAUSE = 0.01


async def run_probing_health(served: RunningEngine, job: pb.Step) -> tuple[pb.Workflow, float]:
    """Run a workflow of `job` to its end while asking for health: the workflow, and the longest
    the engine kept a health check waiting.

    Engine and test share one event loop, so whatever holds it delays the probe's round, be it
    in its health check, its GetWorkflow or its pause; a health check sent by anyone at that
    moment would have waited as long. So each round is timed whole, less the pause.
    """
    health = health_pb2_grpc.HealthStub(served.channel)
    task_id = await start(served, job)
    deadline = time.monotonic() + 60
    slowest = 0.0
    while time.monotonic() < deadline:
        began = time.perf_counter()
        answer = await health.Check(health_pb2.HealthCheckRequest())
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        workflow = await served.stub.GetWorkflow(
            pb.GetWorkflowRequest(task_id=task_id), metadata=TENANT
        )
        await asyncio.sleep(PAUSE)
        slowest = max(slowest, time.perf_counter() - began - PAUSE)
        if workflow.status in TERMINAL:
            return workflow, slowest
    raise TimeoutError(f"workflow {task_id} did not end; slowest health check {slowest:.3f} s")


@pytest.mark.timing
@pytest.mark.timeout(120)  # Python's `re` would hold the loop, and this test, until then
async def test_a_backtracking_pattern_is_judged_while_health_answers_at_once(
    served: RunningEngine,
) -> None:
    printed = shell_step(
        "print",
        f"{JOB_PYTHON} -c \"print('a' * {AS} + '!')\"",
        expect=[check("stdout_matches", "(a+)+$"), check("stdout_matches", "^a+!$")],
    )

    workflow, slowest = await run_probing_health(served, printed)

    assert slowest < 0.5, f"a health check took {slowest:.3f} s while the pattern was judged"
    # Judged, as RE2 sees it: no run of `a`s ends the output, which `^a+!$` matches whole.
    assert workflow.status == pb.FAILED
    judged = [(f["passed"], f["detail"]) for f in findings(workflow, "print")]
    assert [passed for passed, _ in judged] == [True, False, True]  # exit code, then the two
    assert judged[1][1].startswith("expected stdout to match /(a+)+$/")


@pytest.mark.timing
async def test_a_costly_linear_pattern_is_judged_off_the_event_loop(
    served: RunningEngine,
) -> None:
    # Within the bounds on a pattern's size, yet about a second of RE2 for 64,000 `a`/`b` (the
    # most a job prints here). Judged on the event loop, it kept health waiting 0.8 to 1.2 s;
    # judged off it, a probe's round took 0.1 s at most.
    printed = shell_step(
        "print",
        f"{JOB_PYTHON} -c \"import random; print(''.join(random.choices('ab', k=64000)))\"",
        expect=[check("stdout_matches", "(a|b)*a(a|b){600}c")],
    )

    workflow, slowest = await run_probing_health(served, printed)

    assert slowest < 0.5, f"a health check took {slowest:.3f} s while the pattern was judged"
    assert workflow.status == pb.FAILED
    _, matched = findings(workflow, "print")
    assert matched["passed"] is False
    assert matched["detail"].startswith("expected stdout to match /"), matched


async def test_a_pattern_the_linear_engine_cannot_run_is_refused_at_start(
    served: RunningEngine,
) -> None:
    backreference = step(
        "s", "echo", "aa", expect=[check("exit_code", equals=0), check("stdout_matches", r"(a)\1")]
    )
    error = await refused(served, backreference)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error.details() or "").startswith("task.steps[0].expect[1].value: ")


@pytest.fixture
def root_only_file(tmp_path: Path) -> Path:
    """A file of the host's that only root may read, outside every job's directory."""
    vault = tmp_path / "vault"
    vault.mkdir(mode=0o700)
    secret = vault / "shadow"
    secret.write_text("root:$6$secret\n")
    secret.chmod(0o600)
    return secret


async def test_a_path_outside_the_work_dir_is_refused_at_start(
    served: RunningEngine, root_only_file: Path
) -> None:
    for path in (str(root_only_file), "../../../vault/shadow", "out/../../shadow"):
        probe = step("s", "true", expect=[check("file_exists", path)])
        error = await refused(served, probe)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, path
        assert (error.details() or "").startswith("task.steps[0].expect[0].value: "), path


async def test_a_link_the_job_plants_is_not_followed_out_of_its_work_dir(
    served: RunningEngine, root_only_file: Path
) -> None:
    inside_root = str(root_only_file).lstrip("/")
    planted = shell_step(
        "plant",
        f"echo hi > out.txt && ln -s {root_only_file} leak && ln -s / host",
        expect=[
            check("file_exists", "out.txt"),
            check("file_exists", "leak"),
            check("file_exists", f"host/{inside_root}"),
        ],
    )
    task_id = await start(served, planted)
    workflow = await wait_for_status(served.stub, task_id, metadata=TENANT)

    assert workflow.status == pb.FAILED
    _, wrote, leak, host = findings(workflow, "plant")  # the implicit exit code, then these
    assert wrote["passed"] is True, wrote  # a file the job wrote, by its relative path
    for planted_link in (leak, host):
        assert planted_link["passed"] is False, planted_link
        assert "link out of the work dir" in planted_link["detail"], planted_link
