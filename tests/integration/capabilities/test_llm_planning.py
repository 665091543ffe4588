"""The ``llm`` planner and verifier over gRPC, against an OpenAI-compatible model server.

The server (`tests.support.model_server`) is a real HTTP server on a free port answering from a
script
per test; it refuses any request without the model, the messages, a token limit and the
answer's JSON Schema, and each test checks it refused none.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog.testing
from google.protobuf import json_format

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.helpers import new_task_id, wait_for_status, write_secret
from tests.support.model_server import API_KEY, MODEL, ModelServer, Reply, model_fixture  # noqa: F401
from workflow_engine.capabilities.model.answer_schemas import plan_schema
from workflow_engine.config import LlmSettings, Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb

PAUSED_OR_DONE = {pb.SUCCEEDED, pb.FAILED, pb.CANCELLED, pb.SUSPENDED, pb.WAITING_FOR_APPROVAL}
PROMPT = "Add a health endpoint and prove it answers 200"
CRITERION = "the health check answers 200"
ALLOW_ECHO = {"allow": ["echo", "true"], "deny": ["rm", "curl"]}


def plan(*steps: dict[str, Any], assumptions: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"steps": list(steps), "assumptions": list(assumptions)}


def health_step(*command: str) -> dict[str, Any]:
    return {
        "id": "health",
        "description": "ask the health endpoint",
        "command": list(command or ("echo", "HTTP 200 OK")),
        "expect": [{"kind": "stdout_contains", "value": "200"}],
    }


def state_of(wf: pb.Workflow) -> dict[str, Any]:
    return json_format.MessageToDict(wf.state)


def told_again(model: ModelServer, kind: str) -> str:
    """What the model was sent the second time it was asked for a `kind` (it names what the
    first answer got wrong)."""
    _, again = model.asked(kind)
    return json.dumps(again.body["messages"])


Start = Callable[..., Awaitable[RunningEngine]]


@pytest.fixture
async def engine(settings: Settings, model: ModelServer, tmp_path: Path) -> AsyncIterator[Start]:
    """Starts an engine whose planner (and, by default, verifier) is the scripted model."""
    started: list[RunningEngine] = []

    async def start(
        policy: dict[str, Any] | None = ALLOW_ECHO, verifier: str = "llm", **llm: Any
    ) -> RunningEngine:
        policy_file = ""
        if policy is not None:
            path = tmp_path / "policy.json"
            path.write_text(json.dumps(policy))
            policy_file = str(path)
        key_file = tmp_path / "api-key"
        write_secret(key_file, API_KEY + "\n")
        llm_settings = LlmSettings(
            base_url=model.base_url,
            model=MODEL,
            api_key_file=str(key_file),
            **{"timeout_seconds": 5, "retries": 2, "retry_max_seconds": 0.1, **llm},
        )
        running = await start_engine(
            replace(
                settings,
                planner="llm",
                verifier=verifier,
                llm=llm_settings,
                command_policy_file=policy_file,
            )
        )
        started.append(running)
        return running

    yield start
    for running in started:
        await stop_engine(running)


async def run(
    running: RunningEngine, statuses: set[int] = PAUSED_OR_DONE, **task: Any
) -> pb.Workflow:
    task_id = new_task_id()
    spec = pb.TaskSpec(
        prompt=PROMPT,
        acceptance_criteria=[pb.AcceptanceCriterion(description=CRITERION)],
        **task,
    )
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    return await wait_for_status(running.stub, task_id, statuses)


def node_detail(wf: pb.Workflow, node: str) -> str:
    return " | ".join(e.detail for e in wf.history if e.node_id == node)


async def test_a_prompt_only_task_is_planned_run_and_verified(
    engine: Start, model: ModelServer
) -> None:
    model.script("plan", plan(health_step(), assumptions=("the endpoint is local",)))
    running = await engine()
    wf = await run(running)

    assert wf.status == pb.SUCCEEDED, wf.error
    state = state_of(wf)
    assert [s["id"] for s in state["plan"]["steps"]] == ["health"]
    assert "the endpoint is local" in state["plan"]["assumptions"]
    assert state["results"][0]["stdout"] == "HTTP 200 OK\n"
    findings = state["steps"]["health"]["verification"]["findings"]
    assert {"check": "model:evidence", "passed": True, "detail": "the output shows it"} in findings
    # One plan and one verification; each accounted for in state and in its node's event.
    calls = state["model_calls"]
    assert [(c["node"], c["purpose"], c["model"]) for c in calls] == [
        ("plan_steps", "plan", MODEL),
        ("verify_step_result", "verify", MODEL),
    ]
    assert all(c["prompt_tokens"] > 0 and c["completion_tokens"] > 0 for c in calls)
    assert state["model_tokens"] == sum(c["prompt_tokens"] + c["completion_tokens"] for c in calls)
    assert f"[model {MODEL}: 1 call(s)" in node_detail(wf, "plan_steps")
    assert f"[model {MODEL}: 1 call(s)" in node_detail(wf, "verify_step_result")
    # The planner was told the task, its criteria and the workers, in the plan's own schema.
    (asked,) = model.asked("plan")
    told = json.dumps(asked.body["messages"])
    assert PROMPT in told and CRITERION in told and "sandbox" in told
    assert "leave `required_labels` empty" in told  # the sandbox refuses steps that ask
    schema = asked.body["response_format"]["json_schema"]["schema"]
    assert schema == plan_schema("full")  # what a model writes (`answer_schemas`)


async def test_an_invalid_plan_is_asked_for_again_with_what_was_wrong(
    engine: Start, model: ModelServer
) -> None:
    bad = plan({"id": "health", "command": []})
    model.script("plan", bad, plan(health_step()))
    running = await engine()
    wf = await run(running)

    assert wf.status == pb.SUCCEEDED, wf.error
    _, second = model.asked("plan")
    correction = second.body["messages"][-1]["content"]
    assert "plan.steps[0].command: argv must not be empty" in correction
    assert len(state_of(wf)["model_calls"]) == 3  # two plans, one verification


async def test_a_plan_invalid_every_time_fails_the_workflow_quoting_what_was_wrong(
    engine: Start, model: ModelServer
) -> None:
    bad = plan({"id": "no spaces allowed", "command": ["echo"]})
    model.script("plan", bad, bad, bad)
    running = await engine(plan_attempts=3)
    wf = await run(running)

    assert wf.status == pb.FAILED
    assert len(model.asked("plan")) == 3
    assert "plan was invalid 3 time(s)" in wf.error
    assert "plan.steps[0].id: must be 1-64 letters" in wf.error


async def test_429_with_retry_after_and_500_are_retried(engine: Start, model: ModelServer) -> None:
    model.script(
        "plan",
        Reply(status=429, headers={"Retry-After": "1"}),
        Reply(status=500),
        plan(health_step()),
    )
    running = await engine(retries=3)
    wf = await run(running)

    assert wf.status == pb.SUCCEEDED, wf.error
    first, second, third = model.asked("plan")
    assert [c.status for c in (first, second, third)] == [429, 500, 200]
    assert second.at - first.at >= 0.95  # Retry-After honoured
    assert len(state_of(wf)["model_calls"]) == 2  # only answered calls are accounted


@pytest.mark.parametrize(
    ("replies", "expected"),
    [
        (
            [Reply(delay=3, json=plan(health_step()))] * 2,
            "the model did not answer in time (after 2 attempt(s))",
        ),
        ([Reply(status=401)], "the model server answered HTTP 401"),
        ([Reply(content="Sure! Here is your plan")] * 3, "the answer is not JSON"),
        (
            [Reply(content='{"steps": [', finish_reason="length")] * 3,
            "the model's plan was invalid 3 time(s); last: the model's answer was cut at",
        ),
        ([Reply(refusal="I cannot help with that")], "the model refused"),
    ],
    ids=["timeout", "4xx", "not-json", "truncated", "refusal"],
)
async def test_a_model_failure_fails_the_workflow_with_a_clear_finding(
    engine: Start, model: ModelServer, replies: list[Reply], expected: str
) -> None:
    model.script("plan", *replies)
    running = await engine(timeout_seconds=0.5, retries=1)
    wf = await run(running)

    assert wf.status == pb.FAILED
    assert expected in wf.error
    assert wf.error.startswith("planner failed: ")
    assert state_of(wf)["verification"]["findings"][0]["check"] == "planner"


async def test_an_unreadable_answer_is_asked_for_again_and_counted(
    engine: Start, model: ModelServer
) -> None:
    """An answer cut at the token limit, then one with no JSON, are asked for again (the first
    shorter); the third is the plan. Every answer's tokens are in the workflow's total."""
    model.script(
        "plan",
        Reply(content='{"steps": [{"id": "health", "comm', finish_reason="length"),
        Reply(content="I would start by checking the endpoint."),
        plan(health_step()),
    )
    running = await engine(plan_max_tokens=77)
    wf = await run(running)

    assert wf.status == pb.SUCCEEDED, wf.error
    first, second, third = model.asked("plan")
    assert first.body["max_tokens"] == 77  # WORKFLOW_ENGINE_LLM_PLAN_MAX_TOKENS
    told = json.dumps(second.body["messages"])
    assert "cut at" in told and "the limit is 77" in told and "Answer again, shorter" in told
    assert "the answer is not JSON" in json.dumps(third.body["messages"])
    calls = [c for c in state_of(wf)["model_calls"] if c["purpose"] == "plan"]
    assert len(calls) == 3
    assert state_of(wf)["model_tokens"] >= sum(
        c["prompt_tokens"] + c["completion_tokens"] for c in calls
    )


async def test_each_purpose_has_its_own_token_limit(engine: Start, model: ModelServer) -> None:
    model.script("plan", plan(health_step()))
    running = await engine(max_tokens=300, verify_max_tokens=40, summary=True)
    wf = await run(running)

    assert wf.status == pb.SUCCEEDED, wf.error
    assert [c.body["max_tokens"] for c in model.asked("plan")] == [300]  # the general limit
    assert [c.body["max_tokens"] for c in model.asked("verification")] == [40]
    assert [c.body["max_tokens"] for c in model.asked("summary")] == [300]


def shape(call: Any) -> str:
    """The structured-output rung a request was asked in."""
    form = call.body.get("response_format") or {}
    if form.get("type") == "json_object":
        return "json_object_schema" if "schema" in form else "json_object"
    return str(form.get("type", "text"))


@pytest.mark.parametrize(
    ("model", "refused", "rung"),
    [
        ("openai", [], "json_schema"),
        ("llama-cpp-python", [500], "json_object_schema"),
        ("no-response-format", [400, 400, 400], "text"),
    ],
    indirect=["model"],
)
async def test_every_dialect_plans_and_its_rung_is_remembered(
    engine: Start,
    model: ModelServer,
    refused: list[int],
    rung: str,
) -> None:
    """A server that refuses a request shape moves the endpoint down the ladder at once (no
    retry of the same shape), once: the second workflow, and the verifier, ask in the rung
    that worked."""
    model.script("plan", plan(health_step()), plan(health_step()))
    running = await engine()
    with structlog.testing.capture_logs() as logged:
        first = await run(running)
        second = await run(running)

    assert (first.status, second.status) == (pb.SUCCEEDED, pb.SUCCEEDED), first.error
    plans = model.asked("plan")
    assert [c.status for c in plans] == [*refused, 200, 200]
    assert [shape(c) for c in plans[len(refused) :]] == [rung, rung]
    assert {shape(c) for c in model.asked("verification")} == {rung}
    assert all(c.status == 200 for c in model.asked("verification"))
    if rung in ("json_object", "text"):  # the schema is in the prompt
        assert "JSON Schema:" in plans[-1].body["messages"][0]["content"]
    stepped = [e["mode"] for e in logged if e["event"] == "model_output_mode"]
    assert len(stepped) == len(refused)  # each step down logged once


@pytest.mark.parametrize("model", ["llama-cpp-python"], indirect=True)
async def test_a_pinned_rung_the_server_refuses_fails_at_once(
    engine: Start, model: ModelServer
) -> None:
    model.script("plan", plan(health_step()))
    running = await engine(output_mode="json_schema", retries=3)
    wf = await run(running)

    assert wf.status == pb.FAILED
    assert [c.status for c in model.asked("plan")] == [500]  # not retried, not walked
    assert "does not take the json_schema request shape" in wf.error
    assert "WORKFLOW_ENGINE_LLM_OUTPUT_MODE" in wf.error


async def test_a_server_error_about_something_else_is_retried_in_the_same_shape(
    engine: Start, model: ModelServer
) -> None:
    model.script("plan", Reply(status=500), Reply(status=503), plan(health_step()))
    running = await engine(retries=3)
    wf = await run(running)

    assert wf.status == pb.SUCCEEDED, wf.error
    assert [(c.status, shape(c)) for c in model.asked("plan")] == [
        (500, "json_schema"),
        (503, "json_schema"),
        (200, "json_schema"),
    ]


async def test_a_denied_command_is_refused(engine: Start, model: ModelServer) -> None:
    model.script("plan", plan(health_step("rm", "-rf", "/tmp/health")))
    running = await engine()
    wf = await run(running)

    assert wf.status == pb.FAILED
    assert "step health: the model planned the command" in wf.error
    assert "which the command policy denies (deny pattern 'rm'" in wf.error
    assert not state_of(wf)["plan"]["steps"]  # nothing of it was planned, nothing ran


async def test_an_unlisted_command_waits_for_approval(engine: Start, model: ModelServer) -> None:
    model.script("plan", plan(health_step("printf", "200\\n")))
    running = await engine()
    wf = await run(running)

    assert wf.status == pb.WAITING_FOR_APPROVAL, wf.error
    assert wf.pending_approval.step_id == "health"
    rule = "no pattern matches; the default of the policy policy.json"
    assert wf.pending_approval.reason == (
        f"step health requires approval before it runs ({rule}; the model planned it)"
    )
    assert state_of(wf)["plan"]["assumptions"] == [
        f"command policy: step health waits for approval ({rule})"
    ]
    await running.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(
            task_id=wf.task_id,
            decision=pb.ApprovalDecision(step_id="health", verdict=pb.APPROVE, decided_by="al"),
        )
    )
    done = await wait_for_status(running.stub, wf.task_id)
    assert done.status == pb.SUCCEEDED, done.error


async def test_without_a_policy_every_model_planned_step_waits_for_approval(
    engine: Start, model: ModelServer
) -> None:
    model.script("plan", plan(health_step()))
    running = await engine(policy=None)
    wf = await run(running)

    assert wf.status == pb.WAITING_FOR_APPROVAL, wf.error
    assert "the default policy" in wf.pending_approval.reason


async def test_a_failed_machine_check_fails_the_step_whatever_the_model_says(
    engine: Start, model: ModelServer
) -> None:
    model.script("plan", plan(health_step("echo", "HTTP 503")))  # the default verdict: pass
    running = await engine()
    wf = await run(running, max_attempts_per_step=1)

    assert wf.status == pb.FAILED
    verification = state_of(wf)["steps"]["health"]["verification"]
    assert verification["status"] == "fail"
    by_check = {f["check"]: f["passed"] for f in verification["findings"]}
    assert by_check["stdout_contains"] is False
    assert by_check["model:evidence"] is True  # the model said pass, and was overruled
    assert len(model.asked("verification")) == 1


async def test_a_failed_verification_revises_the_step_and_the_next_attempt_passes(
    engine: Start, model: ModelServer
) -> None:
    model.script("plan", plan(health_step("echo", "HTTP 503")))
    failed = {
        "status": "fail",
        "findings": [{"check": "status line", "passed": False, "detail": "it answered 503"}],
        "recommended_actions": ["answer 200"],
    }
    model.script("verification", failed)
    model.script("step", health_step("echo", "HTTP 200 OK"))
    running = await engine()
    wf = await run(running)

    assert wf.status == pb.SUCCEEDED, wf.error
    state = state_of(wf)
    assert state["attempts_by_step"] == {"health": 2}
    assert state["plan"]["steps"][0]["command"] == ["echo", "HTTP 200 OK"]
    (revision,) = state["revisions"]
    assert revision["step_id"] == "health" and revision["after_attempt"] == 1
    assert revision["command_before"] == ["echo", "HTTP 503"]
    assert revision["command_after"] == ["echo", "HTTP 200 OK"]
    assert "it answered 503" in revision["reason"]
    assert "revised health" in node_detail(wf, "verify_step_result")
    # The planner was told what failed.
    (asked,) = model.asked("step")
    assert "answer 200" in json.dumps(asked.body["messages"])


async def test_a_planned_step_the_sandbox_cannot_run_is_asked_for_again(
    engine: Start, model: ModelServer, tmp_path: Path
) -> None:
    """The local sandbox has no labels: a plan whose step asks for some is invalid, and the
    model is asked again with why; the labelled step is never run."""
    marker = tmp_path / "ran"
    labelled = {**health_step("touch", str(marker)), "required_labels": ["gpu"]}
    model.script("plan", plan(labelled), plan(health_step()))
    running = await engine(policy={"allow": ["echo", "touch"]}, verifier="checks")
    wf = await run(running)

    assert wf.status == pb.SUCCEEDED, wf.error
    assert not marker.exists()
    state = state_of(wf)
    assert state["attempts_by_step"] == {"health": 1}
    assert state["results"][0]["stdout"] == "HTTP 200 OK\n"
    assert "plan.steps[0].required_labels: the local sandbox has no labels" in told_again(
        model, "plan"
    )


async def test_a_revised_step_the_sandbox_cannot_run_is_asked_for_again(
    engine: Start, model: ModelServer
) -> None:
    model.script("plan", plan(health_step("echo", "HTTP 503")))
    model.script("step", {**health_step(), "required_labels": ["gpu"]}, health_step())
    running = await engine(verifier="checks")
    wf = await run(running)

    assert wf.status == pb.SUCCEEDED, wf.error
    state = state_of(wf)
    assert state["attempts_by_step"] == {"health": 2}
    assert state["plan"]["steps"][0]["required_labels"] == []
    assert "step.required_labels: the local sandbox has no labels" in told_again(model, "step")


async def test_a_revised_step_the_policy_does_not_allow_waits_for_approval_again(
    engine: Start, model: ModelServer
) -> None:
    """The revision goes through the policy again: a command it does not allow waits for a
    person, even though the first command ran unasked."""
    model.script("plan", plan(health_step("echo", "HTTP 503")))
    failed = {
        "status": "fail",
        "findings": [{"check": "status line", "passed": False, "detail": "it answered 503"}],
        "recommended_actions": ["answer 200"],
    }
    model.script("verification", failed)
    model.script("step", health_step("printf", "HTTP 200 OK"))  # printf: not in ALLOW_ECHO
    running = await engine()
    wf = await run(running)

    assert wf.status == pb.WAITING_FOR_APPROVAL, wf.error
    assert wf.pending_approval.step_id == "health"
    assert list(wf.pending_approval.command) == ["printf", "HTTP 200 OK"]
    # The revision's decision, not the plan's (which let `echo` run), is the one named.
    rule = "no pattern matches; the default of the policy policy.json"
    assert wf.pending_approval.reason == (
        f"step health requires approval before it runs ({rule}; the model planned it)"
    )
    assert [r["policy"] for r in state_of(wf)["revisions"]] == [
        f"command policy: step health waits for approval ({rule})"
    ]
    await running.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(
            task_id=wf.task_id,
            decision=pb.ApprovalDecision(step_id="health", verdict=pb.APPROVE),
        )
    )
    done = await wait_for_status(running.stub, wf.task_id)
    assert done.status == pb.SUCCEEDED, done.error
    assert state_of(done)["attempts_by_step"] == {"health": 2}


async def test_the_token_budget_suspends_the_workflow(engine: Start, model: ModelServer) -> None:
    model.script("plan", plan(health_step()))
    running = await engine()
    wf = await run(running, budget=pb.Budget(max_model_tokens=10))

    assert wf.status == pb.SUSPENDED, wf.error
    assert "model token(s) is used up" in wf.summary
    assert "remaining: health" in wf.summary
    await running.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(task_id=wf.task_id, budget=pb.Budget(max_model_tokens=100_000))
    )
    done = await wait_for_status(running.stub, wf.task_id)
    assert done.status == pb.SUCCEEDED, done.error
    assert len(model.asked("plan")) == 1


async def test_the_model_writes_the_summary_when_asked(engine: Start, model: ModelServer) -> None:
    model.script("plan", plan(health_step()))
    running = await engine(summary=True)
    wf = await run(running)

    assert wf.status == pb.SUCCEEDED, wf.error
    assert wf.summary == "The model's summary: everything passed."
    assert [c["purpose"] for c in state_of(wf)["model_calls"]] == ["plan", "verify", "summary"]


async def test_the_model_is_told_no_secret(engine: Start, model: ModelServer) -> None:
    secret = f"for-the-job-only-{uuid.uuid4().hex}"
    running = await engine(summary=True)
    step = pb.Step(
        id="health",
        command=["sh", "-c", 'echo "HTTP 200 OK, token $TOKEN"'],
        env={"TOKEN": secret},
        secret_env=["TOKEN"],
    )
    wf = await run(running, steps=[step])

    assert wf.status == pb.SUCCEEDED, wf.error
    assert [call.schema_name for call in model.calls] == ["verification", "summary"]
    for call in model.calls:  # the job's output, and the plan's env
        assert secret not in json.dumps(call.body)
        assert "[secret]" in json.dumps(call.body)
