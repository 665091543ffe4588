"""The ``llm`` planner and verifier against model servers people really run.

SmolLM2-135M-Instruct is served by llama-cpp-python's stock OpenAI-compatible server (it
refuses ``json_schema`` and takes ``json_object`` with a ``schema``) and by llama.cpp's own
``llama-server`` (it takes ``json_schema``). A served engine, started as an operator would,
plans a task written in plain words with it, runs the steps in its sandbox, has the model judge
them, and ends. A 135M model may well fail the task: any terminal status is fine, an engine
failure never is.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, wait_for_status
from tests.support.llama_server import LlamaCppServer, LlamaServer, model_python
from workflow_engine.capabilities.model.answer_schemas import (
    PROFILES,
    SUMMARY,
    plan_schema,
    step_schema,
    verification_schema,
)
from workflow_engine.domain import Plan
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

#: A 135M model on 2 cores answers in seconds, but a full-profile plan is cut only at its limit.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

PROMPT = "Create a file named hello.txt containing the word hello, then show its contents."
TERMINAL = {pb.SUCCEEDED, pb.FAILED, pb.CANCELLED, pb.SUSPENDED, pb.WAITING_FOR_APPROVAL}

#: Converts each schema with the grammar converter llama-cpp-python's server uses, in the
#: model's environment; prints what it could not convert.
CONVERT = """
import json, sys
from llama_cpp import llama_grammar
failed = {}
for name, schema in json.load(sys.stdin).items():
    try:
        llama_grammar.LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
    except Exception as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps(failed))
"""


def converted(schemas: dict[str, Any]) -> dict[str, str]:
    """The schemas llama.cpp's converter (as llama-cpp-python ships it) refuses, and why."""
    out = subprocess.run(
        [str(model_python()), "-c", CONVERT],
        input=json.dumps(schemas),
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    failed: dict[str, str] = json.loads(out.stdout.strip().splitlines()[-1])
    return failed


def test_every_schema_a_model_answers_in_converts_to_a_grammar() -> None:
    schemas: dict[str, Any] = {"summary": SUMMARY}
    for profile in PROFILES:
        schemas[f"plan/{profile}"] = plan_schema(profile)
        schemas[f"step/{profile}"] = step_schema(profile)
        schemas[f"verification/{profile}"] = verification_schema(profile)
    assert converted(schemas) == {}
    # The converter does refuse what it cannot take: the domain's own schema, with its untyped
    # `Check.equals`, is what the server fell back to "any JSON" on.
    assert "domain plan" in converted({"domain plan": Plan.model_json_schema()})


Server = LlamaServer | LlamaCppServer
#: The rungs a server's endpoint steps down, (refused, taken), as the engine logs them.
STEPS_DOWN = {"llama-cpp-python": [("json_schema", "json_object_schema")], "llama-server": []}


def engine_env(llama: Server, policy: Path, profile: str) -> dict[str, str]:
    return {
        "WORKFLOW_ENGINE_PLANNER": "llm",
        "WORKFLOW_ENGINE_VERIFIER": "llm",
        "WORKFLOW_ENGINE_LLM_BASE_URL": llama.base_url,
        "WORKFLOW_ENGINE_LLM_MODEL": llama.model,
        "WORKFLOW_ENGINE_LLM_PROFILE": profile,
        "WORKFLOW_ENGINE_LLM_TIMEOUT_SECONDS": "120",
        "WORKFLOW_ENGINE_COMMAND_POLICY_FILE": str(policy),
    }


async def run_with_model(
    db_url: str, tmp_path: Path, processes: list[EngineProcess], env: dict[str, str]
) -> tuple[EngineProcess, pb.Workflow, dict[str, Any]]:
    """A served engine with the real model plans and runs `PROMPT` to its end."""
    engine = EngineProcess(
        db_url=db_url, data_dir=tmp_path / "data", holder_id="model", extra_env=env
    )
    processes.append(engine)
    task_id = new_task_id()
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        spec = pb.TaskSpec(
            prompt=PROMPT,
            acceptance_criteria=[pb.AcceptanceCriterion(description="hello.txt holds hello")],
        )
        await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        wf = await wait_for_status(stub, task_id, TERMINAL, timeout=600)
    return engine, wf, json_format.MessageToDict(wf.state)


def assert_ended_cleanly(
    llama: Server, engine: EngineProcess, wf: pb.Workflow, state: dict[str, Any]
) -> None:
    """The server took the rung it should (llama-cpp-python refused json_schema once, and took
    json_object + schema after); every call's tokens are in the total; the workflow ended with
    no engine failure in its record."""
    stepped = [e for e in engine.logs if e.get("event") == "model_output_mode"]
    assert [(e["refused"], e["mode"]) for e in stepped] == STEPS_DOWN[llama.name]
    calls = state["model_calls"]
    assert calls and all(c["completion_tokens"] > 0 for c in calls)
    spent = sum(c["prompt_tokens"] + c["completion_tokens"] for c in calls)
    assert int(state["model_tokens"]) >= spent
    assert wf.status in TERMINAL
    for bad in ("INTERNAL", "Traceback", "HTTP 500"):
        assert bad not in wf.error
    assert not [e for e in engine.logs if e.get("level") in ("error", "critical")]


async def test_the_small_profile_plans_runs_and_judges_with_a_135m_model(
    db_url: str,
    tmp_path: Path,
    processes: list[EngineProcess],
    llama: Server,
    policy: Path,
) -> None:
    engine, wf, state = await run_with_model(
        db_url, tmp_path, processes, engine_env(llama, policy, "small")
    )

    assert_ended_cleanly(llama, engine, wf, state)
    assert state["plan"]["steps"], wf.error  # a plan was made and validated
    assert state.get("results"), wf.error  # its steps ran
    assert {c["purpose"] for c in state["model_calls"]} >= {"plan", "verify"}  # it was judged


async def test_the_full_profile_ends_with_a_clear_finding_or_a_plan(
    db_url: str,
    tmp_path: Path,
    processes: list[EngineProcess],
    llama: Server,
    policy: Path,
) -> None:
    """The full profile asks more than a 135M model can give (it writes steps until its answer
    is cut); whatever it does, the workflow ends and says why."""
    env = {**engine_env(llama, policy, "full"), "WORKFLOW_ENGINE_LLM_PLAN_MAX_TOKENS": "512"}
    engine, wf, state = await run_with_model(db_url, tmp_path, processes, env)

    assert_ended_cleanly(llama, engine, wf, state)
    if not state["plan"]["steps"]:
        assert wf.status == pb.FAILED
        assert wf.error.startswith("planner failed: the model's plan was invalid 3 time(s)")
        assert sum(c["purpose"] == "plan" for c in state["model_calls"]) == 3
