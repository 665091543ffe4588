"""Whoever controls the model's answer (a prompt injection in a task or a job's output, or the
model server itself) is an attacker: it writes what the engine parses and plans.

What it must not reach: a stalled event loop or an unexplained failure from an answer built to
choke the parser (deep nesting, endless braces, megabytes of text), and any field of a step
that the schema a model writes does not offer (the `image` a worker node runs, raised `limits`,
`secret_env`): those are the caller's and the operator's, never the model's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from tests.conftest import RunningEngine, stop_engine
from tests.security.conftest import start_planned
from tests.security.stalls import HealthWatch
from tests.security.test_secrets import stored_state
from tests.support.helpers import new_task_id, wait_for_status
from tests.support.model_server import ModelServer, Reply
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


@pytest.mark.timing
@pytest.mark.parametrize(
    "content",
    [
        "[" * 200_000,
        "{" * 200_000,
        '{"steps": [' * 50_000,
        "Sure. " * 700_000,  # 4 MB of prose
        '{"a": "' + "x" * 1_000_000,  # an object that never ends
        '{"a":[' * 33 + '{"k":1},' * 32_700 + "x",  # 33 starts, each parsing to the end
    ],
    ids=["deep-lists", "braces", "deep-steps", "megabytes", "unterminated", "many-starts"],
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


def completion(content: Any = '{"steps": []}', **usage: Any) -> dict[str, Any]:
    """A response body shaped as a server's, with `content` and `usage` as given."""
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
    }


VALID = json.dumps({"steps": [{"id": "hello", "command": ["echo", "hello"], "expect": []}]})


@pytest.mark.parametrize(
    ("body", "planned_ok"),
    [
        (completion(VALID, prompt_tokens="abc", completion_tokens=[1]), True),
        (completion(VALID, prompt_tokens=1e400, completion_tokens=7), True),
        (
            json.dumps(completion(VALID, completion_tokens=7)).replace(
                '"completion_tokens": 7', '"completion_tokens": 1' + "0" * 5000
            ),
            False,  # the SDK cannot read the body: a finding
        ),
        (completion(VALID, prompt_tokens=-1_000_000_000, completion_tokens=-5), True),
        (completion({"steps": []}), False),
        (completion(5), False),
        ({**completion(), "choices": [{"index": 0, "message": None}]}, False),
        ({**completion(), "choices": {"a": 1}}, False),
        ([1, 2], False),
        ("not JSON at all", False),
    ],
    ids=[
        "tokens-not-numbers",
        "tokens-infinite",
        "tokens-5000-digits",
        "tokens-negative",
        "content-object",
        "content-number",
        "message-null",
        "choices-object",
        "body-list",
        "body-string",
    ],
)
async def test_a_hostile_servers_answer_is_a_finding_not_an_engine_failure(
    planned: RunningEngine, model: ModelServer, body: Any, planned_ok: bool
) -> None:
    """Whatever the server's body holds, the plan is made or fails with the planner's
    finding; a token count it gives is never negative nor unbounded."""
    model.script("plan", *[Reply(body=body)] * 3)
    wf = await plan_once(planned)

    state = json_format.MessageToDict(wf.state)
    if planned_ok:
        assert wf.status == pb.SUCCEEDED, wf.error
        assert 0 <= int(state.get("model_tokens", 0)) <= 20_000_000
    else:
        assert wf.status == pb.FAILED
        assert wf.error.startswith("planner failed: the model"), wf.error
    assert "internal" not in wf.error.lower()
    assert "Error(" not in wf.error  # no exception's repr


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


async def test_a_revision_keeps_the_callers_protections_and_never_sees_a_secret(
    planned: RunningEngine, model: ModelServer, settings: Settings
) -> None:
    """The model revises a failed step of the caller's and answers without its protections,
    with a secret variable of its own: the caller's `secret_env`, `limits` and the secret's
    value stay; the model was never shown the value."""
    secret = "s3cret-token-value-0123456789"
    step = pb.Step(
        id="health",
        command=["echo", "HTTP 503"],
        env={"TOKEN": secret},
        secret_env=["TOKEN"],
        limits=pb.ResourceLimits(memory_mb=256, processes=32),
        expect=[pb.Check(kind="stdout_contains", value="200")],
    )
    revised = {
        "id": "health",
        "command": ["echo", "HTTP 200"],
        "env": {"TOKEN": "chosen-by-the-model"},
        "expect": [{"kind": "stdout_contains", "value": "200"}],
    }
    model.script("step", revised)
    task_id = new_task_id()
    spec = pb.TaskSpec(steps=[step], max_attempts_per_step=2)
    await planned.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    wf = await wait_for_status(planned.stub, task_id, DONE)

    (asked,) = model.asked("step")
    assert secret not in json.dumps(asked.body)
    (stored,) = json_format.MessageToDict(wf.state)["plan"]["steps"]
    assert stored["command"] == ["echo", "HTTP 200"]  # the revision took
    assert stored["secret_env"] == ["TOKEN"]
    assert stored["limits"]["memory_mb"] == 256 and stored["limits"]["processes"] == 32
    kept = (await stored_state(settings, task_id))["plan"]["steps"][0]
    assert kept["env"]["TOKEN"] == secret  # the caller's value, not the model's
