"""Whoever controls the model's answer (a prompt injection in a task or a job's output, or the
model server itself) is an attacker: it writes what the engine parses and plans.

What it must not reach: a stalled event loop or an unexplained failure from an answer built to
choke the parser (deep nesting, endless braces, megabytes of text), and any field of a step
that the schema a model writes does not offer (the `image` a worker node runs, raised `limits`,
`secret_env`): those are the caller's and the operator's, never the model's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.security.conftest import start_planned
from tests.security.stalls import HealthWatch
from tests.security.test_secrets import stored_state
from tests.support.helpers import new_task_id, wait_for_status, write_secret
from tests.support.model_server import API_KEY, MODEL, ModelServer, Reply
from workflow_engine.capabilities.model._client import MAX_ANSWER_BYTES
from workflow_engine.config import LlmSettings, Settings
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


@pytest.fixture
async def impatient(
    settings: Settings, model: ModelServer, tmp_path: Path
) -> AsyncIterator[RunningEngine]:
    """An engine whose planner waits at most 2 s for each of two attempts at a call."""
    running = await start_planned(
        settings, model, tmp_path, {"allow": ["true", "echo"]}, timeout_seconds=2, retries=1
    )
    try:
        yield running
    finally:
        await stop_engine(running)


async def test_a_server_that_answers_a_byte_at_a_time_is_timed_out_per_call(
    impatient: RunningEngine, model: ModelServer
) -> None:
    # Each answer takes minutes at a byte a second; the SDK's own timeout is per read, which
    # every byte resets. The engine's bounds the call as a whole: two attempts of 2 s.
    model.script("plan", Reply(drip=1.0), Reply(drip=1.0))
    wf = await plan_once(impatient)  # gives up after 60 s

    assert wf.status == pb.FAILED
    assert "the model did not answer in time (after 2 attempt(s))" in wf.error, wf.error
    assert len(model.asked("plan")) == 2


async def test_the_model_server_cannot_add_metric_series(
    planned: RunningEngine, model: ModelServer
) -> None:
    # A server that names a new model in each answer: the label is the configured model's.
    registry = planned.engine.context.metrics.enable()
    plan = {"steps": [{"id": "hi", "command": ["echo", "hi"], "expect": []}], "assumptions": []}
    names = [f"model-{i}-" + "m" * 180 for i in range(3)]
    model.script("plan", *[Reply(json=plan, model=name) for name in names])
    for _ in names:
        assert (await plan_once(planned)).status == pb.SUCCEEDED
    served = {
        sample.labels.get("gen_ai_request_model")
        for metric in registry.collect()
        for sample in metric.samples
        if "gen_ai_request_model" in sample.labels
    }
    assert served == {MODEL}


async def test_the_verifiers_brief_shows_the_model_no_secret(
    settings: Settings, model: ModelServer, tmp_path: Path
) -> None:
    # A step whose check looks for its secret in the output: the brief the model judges from
    # quotes the check, the command and the output, each of which holds the secret.
    secret = f"deploy-key-{uuid.uuid4().hex}"
    key = write_secret(tmp_path / "api-key", API_KEY)
    llm = LlmSettings(base_url=model.base_url, model=MODEL, api_key_file=str(key), retries=0)
    running = await start_engine(replace(settings, verifier="llm", llm=llm))
    try:
        step = pb.Step(
            id="show",
            command=["sh", "-c", f'echo "$KEY"; echo {secret} >&2'],
            env={"KEY": secret},
            secret_env=["KEY"],
            expect=[pb.Check(kind="stdout_contains", value=secret)],
        )
        task_id = new_task_id()
        await running.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=pb.TaskSpec(steps=[step]))
        )
        wf = await wait_for_status(running.stub, task_id)
    finally:
        await stop_engine(running)

    assert wf.status == pb.SUCCEEDED, wf.error
    asked = model.asked("verification")
    assert asked, "the model was not asked to judge"
    for call in asked:
        assert secret not in json.dumps(call.body)


def padded(megabytes: int) -> dict[str, Any]:
    """A valid plan's answer padded with an array of `megabytes` MB, as a server writes it."""
    return {**completion(VALID), "padding": [12345678] * (megabytes * 1_000_000 // 10)}


@pytest.mark.timing
@pytest.mark.parametrize(("megabytes", "planned_ok"), [(60, False), (6, True)])
async def test_a_huge_answer_neither_stalls_the_loop_nor_is_read_whole(
    planned: RunningEngine, model: ModelServer, megabytes: int, planned_ok: bool
) -> None:
    # 60 MB: refused as it arrives, past MAX_ANSWER_BYTES (it held the loop 2 to 2.75 s when
    # the SDK parsed it there); 6 MB: read, parsed off the event loop, and planned.
    body = json.dumps(padded(megabytes))  # written now: the test's server shares this process
    model.script("plan", Reply(body=body))
    async with HealthWatch(planned.channel) as watch:
        wf = await plan_once(planned)

    if planned_ok:
        assert wf.status == pb.SUCCEEDED, wf.error
    else:
        assert wf.status == pb.FAILED
        assert f"larger than {MAX_ANSWER_BYTES} bytes" in wf.error, wf.error
    assert watch.worst < MAX_STALL_SECONDS, f"the event loop stalled {watch.worst:.3f} s"
