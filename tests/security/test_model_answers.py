"""Whoever controls the model's answer (a prompt injection in a task or a job's output, or the
model server itself) is an attacker: it writes what the engine parses and plans.

What it must not reach: a stalled event loop or an unexplained failure from an answer built to
choke the parser (deep nesting, endless braces, megabytes of text), and any field of a step
that the schema a model writes does not offer (the `image` a worker node runs, raised `limits`,
`secret_env`): those are the caller's and the operator's, never the model's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf import json_format

from tests.conftest import RunningEngine, stop_engine
from tests.helpers import new_task_id, wait_for_status
from tests.model_server import ModelServer, Reply
from tests.security.conftest import start_planned
from tests.security.stalls import HealthWatch
from workflow_engine.config import Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb

DONE = {pb.SUCCEEDED, pb.FAILED, pb.CANCELLED, pb.SUSPENDED, pb.WAITING_FOR_APPROVAL}
#: The longest a health check may wait while the engine reads a hostile answer.
MAX_STALL_SECONDS = 0.5


@pytest.fixture
async def planned(
    settings: Settings, model: ModelServer, tmp_path: Path
) -> AsyncIterator[RunningEngine]:
    """An engine whose planner is the scripted model; it may run `true` and `echo`."""
    running = await start_planned(settings, model, tmp_path, {"allow": ["true", "echo"]})
    try:
        yield running
    finally:
        await stop_engine(running)


async def plan_once(running: RunningEngine) -> pb.Workflow:
    task_id = new_task_id()
    spec = pb.TaskSpec(prompt="say hello")
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    return await wait_for_status(running.stub, task_id, DONE)


@pytest.mark.parametrize(
    "content",
    [
        "[" * 200_000,
        "{" * 200_000,
        '{"steps": [' * 50_000,
        "Sure. " * 700_000,  # 4 MB of prose
        '{"a": "' + "x" * 1_000_000,  # an object that never ends
    ],
    ids=["deep-lists", "braces", "deep-steps", "megabytes", "unterminated"],
)
async def test_an_answer_built_to_choke_the_parser_fails_the_plan_cleanly(
    planned: RunningEngine, model: ModelServer, content: str
) -> None:
    model.script("plan", *[Reply(content=content)] * 3)
    async with HealthWatch(planned.channel) as watch:
        wf = await plan_once(planned)

    assert wf.status == pb.FAILED
    assert wf.error.startswith("planner failed: the model's plan was invalid 3 time(s); last: ")
    assert "the answer is not JSON" in wf.error
    assert len(wf.error) < 2000  # quoted, not repeated whole
    assert watch.worst < MAX_STALL_SECONDS, f"the event loop stalled {watch.worst:.3f} s"


async def test_a_model_cannot_set_what_its_schema_does_not_offer(
    planned: RunningEngine, model: ModelServer
) -> None:
    step = {
        "id": "hello",
        "command": ["echo", "hello"],
        "expect": [{"kind": "stdout_contains", "value": "hello"}],
        "image": "attacker/registry:latest",
        "limits": {"cpu_seconds": 999_999, "memory_mb": 999_999, "processes": 999_999},
        "secret_env": ["PATH"],
        "requires_approval": False,
    }
    model.script("plan", {"steps": [step], "assumptions": []})
    wf = await plan_once(planned)

    assert wf.status == pb.SUCCEEDED, wf.error
    (stored,) = json_format.MessageToDict(wf.state)["plan"]["steps"]
    assert stored["image"] == ""
    assert stored["secret_env"] == []
    assert set(stored["limits"].values()) == {0}  # the worker's own limits
    assert stored["command"] == ["echo", "hello"]
