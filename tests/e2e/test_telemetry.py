"""Metrics and traces of a real `workflow-engine serve`, read as Prometheus and an
OpenTelemetry Collector would: `/metrics` scraped over HTTP, spans received over OTLP/gRPC."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_llm_crash import PLAN, llm_env
from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, shell_step, task, wait_for_status
from tests.support.model_server import ModelServer
from tests.support.otlp_receiver import OtlpReceiver
from workflow_engine import __version__
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

METRICS_ON = {"WORKFLOW_ENGINE_METRICS_LISTEN": "127.0.0.1:0"}
TWO_STEPS = task(shell_step("a", "echo one"), shell_step("b", "echo two"))


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    collector = OtlpReceiver()
    yield collector
    collector.stop()


def scrape(engine: EngineProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the engine's /metrics, by name and labels."""
    address = engine.wait_for_log("metrics_serving")["address"]
    text = httpx.get(f"http://{address}/metrics", timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    return sum(
        v for (n, got), v in samples.items() if n == name and set(labels.items()) <= set(got)
    )


async def run_to_end(engine: EngineProcess, spec: pb.TaskSpec, metadata: Any = ()) -> pb.Workflow:
    task_id = new_task_id()
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        request = pb.StartWorkflowRequest(task_id=task_id, task=spec)
        await stub.StartWorkflow(request, metadata=metadata)
        return await wait_for_status(stub, task_id)


async def test_metrics_count_workflows_nodes_jobs_leases_and_calls(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    engine = EngineProcess(
        db_url=db_url, data_dir=tmp_path / "data", holder_id="metered", extra_env=METRICS_ON
    )
    processes.append(engine)
    assert (await run_to_end(engine, TWO_STEPS)).status == pb.SUCCEEDED
    async with grpc.aio.insecure_channel(engine.address) as channel:
        missing = pb.GetWorkflowRequest(task_id=new_task_id())
        with pytest.raises(grpc.aio.AioRpcError):
            await pb_grpc.WorkflowEngineStub(channel).GetWorkflow(missing)
    samples = scrape(engine)

    # make install builds jobwrap, static where the C library allows it.
    built = [
        value(samples, "workflow_engine_build_info", version=__version__, jobwrap=linkage)
        for linkage in ("static", "dynamic")
    ]
    assert sum(built) == 1
    assert value(samples, "workflow_engine_workflows_started_total") == 1
    assert value(samples, "workflow_engine_workflows_finished_total", status="SUCCEEDED") == 1
    assert value(samples, "gen_ai_workflow_duration_seconds_count", status="SUCCEEDED") == 1
    for node, runs in (("plan_steps", 1), ("dispatch_step", 2), ("verify_step_result", 2)):
        assert value(samples, "workflow_engine_node_duration_seconds_count", node=node) == runs
    assert value(samples, "workflow_engine_job_duration_seconds_count", status="completed") == 2
    assert value(samples, "workflow_engine_jobs_in_flight") == 0
    # Nine node checkpoints (load, plan, 2 x dispatch/collect/verify, finalize), in batches.
    assert value(samples, "workflow_engine_checkpoint_batch_size_sum") == 9
    assert value(samples, "workflow_engine_lease_events_total", event="acquired") == 1
    assert value(samples, "workflow_engine_lease_events_total", event="released") == 1
    rpc = "rpc_server_call_duration_seconds_count"
    assert value(samples, rpc, rpc_method="StartWorkflow", rpc_grpc_status_code="0") == 1
    not_found = str(grpc.StatusCode.NOT_FOUND.value[0])
    assert value(samples, rpc, rpc_method="GetWorkflow", rpc_grpc_status_code=not_found) == 1


async def test_several_processes_are_served_as_one_sum(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    engine = EngineProcess(
        db_url=db_url,
        data_dir=tmp_path / "data",
        holder_id="pair",
        extra_env={**METRICS_ON, "WORKFLOW_ENGINE_PROCESSES": "2"},
    )
    processes.append(engine)
    for _ in range(4):  # a channel each: the kernel spreads them over both processes
        assert (await run_to_end(engine, TWO_STEPS)).status == pb.SUCCEEDED
    samples = scrape(engine)
    # One build, one series: each process sets it, the sum serves their maximum.
    assert [(n, dict(labels)["version"]) for n, labels in samples if "build_info" in n] == [
        ("workflow_engine_build_info", __version__)
    ]
    assert value(samples, "workflow_engine_build_info") == 1
    assert value(samples, "workflow_engine_workflows_started_total") == 4
    assert value(samples, "workflow_engine_job_duration_seconds_count") == 8


async def test_a_run_is_one_trace_under_the_callers_span_with_its_nodes_jobs_and_model_calls(
    db_url: str,
    tmp_path: Path,
    processes: list[EngineProcess],
    model: ModelServer,
    receiver: OtlpReceiver,
) -> None:
    model.script("plan", PLAN)
    engine = EngineProcess(
        db_url=db_url,
        data_dir=tmp_path / "data",
        holder_id="traced",
        extra_env={
            **llm_env(model, tmp_path),
            **METRICS_ON,
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_SERVICE_NAME": "engine-under-test",
        },
    )
    processes.append(engine)
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    traceparent = (("traceparent", f"00-{trace_id}-{caller_span}-01"),)
    spec = pb.TaskSpec(prompt="Add a health endpoint and prove it answers 200")
    assert (await run_to_end(engine, spec, traceparent)).status == pb.SUCCEEDED

    [run] = receiver.wait_for("workflow run")
    [start] = [s for s in receiver.wait_for("workflow_engine.v1.WorkflowEngine/StartWorkflow")]
    assert (start.trace_id, start.parent_id) == (trace_id, caller_span)  # the caller's trace
    assert (run.trace_id, run.parent_id) == (trace_id, start.span_id)
    assert run.service == "engine-under-test"
    nodes = {s.name: s for s in receiver.spans if s.name.startswith("node ")}
    assert {"node plan_steps", "node dispatch_step", "node finalize_summary"} <= set(nodes)
    assert all(s.parent_id == run.span_id for s in nodes.values())
    [job] = receiver.wait_for("job health")
    assert job.parent_id in {
        nodes["node dispatch_step"].span_id,
        nodes["node collect_result"].span_id,
    }
    assert job.attributes["workflow_engine.job_status"] == "completed"
    chats = receiver.wait_for("chat test-model")
    plan_call = next(c for c in chats if c.attributes["workflow_engine.purpose"] == "plan")
    assert plan_call.parent_id == nodes["node plan_steps"].span_id
    assert plan_call.attributes["gen_ai.usage.input_tokens"] > 0
    # Everything of the run is in the caller's trace (the test's polling calls have their own).
    of_the_run = [s for s in receiver.spans if not s.name.startswith("workflow_engine.v1.")]
    assert {s.trace_id for s in of_the_run} == {trace_id}

    samples = scrape(engine)
    tokens = "gen_ai_client_token_usage_sum"
    assert value(samples, tokens, gen_ai_token_type="input", workflow_engine_purpose="plan") > 0
    assert value(samples, "gen_ai_client_operation_duration_seconds_count") == len(chats)


async def test_off_by_default_nothing_listens_and_nothing_is_exported(
    db_url: str, tmp_path: Path, processes: list[EngineProcess], receiver: OtlpReceiver
) -> None:
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in os.environ
    engine = EngineProcess(db_url=db_url, data_dir=tmp_path / "data", holder_id="quiet")
    processes.append(engine)
    assert (await run_to_end(engine, TWO_STEPS)).status == pb.SUCCEEDED
    assert engine.count("metrics_serving") == 0 and engine.count("tracing_enabled") == 0
