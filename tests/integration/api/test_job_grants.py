"""What a workflow's jobs are granted, as a gRPC client sees it: their user, their limits.

The runner's own tests (`tests/integration/capabilities/test_job_grant.py`) go through each
grant; these check that a step's fields reach it and its refusals come back as findings. (A
task whose step names an image is refused at start: `tests/integration/api/test_bad_input.py`.)
"""

from __future__ import annotations

import os

import pytest
from google.protobuf import json_format

from tests.conftest import RunningEngine
from tests.support.helpers import JOB_PYTHON, new_task_id, shell_step, step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb


async def run(running: RunningEngine, spec: pb.TaskSpec) -> pb.Workflow:
    task_id = new_task_id()
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    return await wait_for_status(running.stub, task_id)


def stdout_of(workflow: pb.Workflow, step_id: str) -> str:
    steps = json_format.MessageToDict(workflow.state)["steps"]
    return str(steps[step_id]["result"]["stdout"])


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs get users of their own only under root")
async def test_a_workflows_steps_share_a_user_that_is_not_root_and_not_another_workflows(
    running: RunningEngine,
) -> None:
    spec = task(shell_step("a", "id -u"), shell_step("b", "id -u"))
    first, second = await run(running, spec), await run(running, spec)
    assert first.status == second.status == pb.SUCCEEDED, first.error or second.error
    user = stdout_of(first, "a")
    assert user != "0\n" and stdout_of(first, "b") == user
    assert stdout_of(second, "a") != user


async def test_a_step_over_its_memory_limit_fails_with_a_finding_naming_it(
    running: RunningEngine,
) -> None:
    grab = step(
        "grab",
        JOB_PYTHON,
        "-c",
        f"x = bytearray({300 * 1024 * 1024})",
        limits=pb.ResourceLimits(memory_mb=100),
    )
    workflow = await run(running, task(grab, max_attempts_per_step=1))
    assert workflow.status == pb.FAILED
    assert "refused more memory than its limits allow" in workflow.error
    assert "memory 100 MiB" in workflow.error
