"""Only callers the engine knows get in, each only as far as its role allows, over real TLS.

Every refusal is checked against the stored rows: a refused call changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support.certificates import Authority
from tests.support.engine_process import ENGINE
from tests.support.helpers import new_task_id, snapshot, step, task, wait_for_status, write_secret
from workflow_engine.config import Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

TOKENS = {
    "orchestrator": "orchestrator-token-0123456789",
    "operator": "operator-token-0123456789abc",
    "reader": "reader-token-0123456789abcdef",
}
DENIED = grpc.StatusCode.PERMISSION_DENIED
NO_ENTRY = grpc.StatusCode.UNAUTHENTICATED


def write_tokens(path: Path) -> Path:
    import hashlib

    callers = [
        {"identity": "the-orchestrator", "role": "orchestrator", "token": TOKENS["orchestrator"]},
        {"identity": "alice", "role": "operator", "token": TOKENS["operator"]},
        {
            "identity": "dashboard",
            "role": "reader",
            "token_sha256": hashlib.sha256(TOKENS["reader"].encode()).hexdigest(),
        },
        {"identity": "ci-runner", "role": "reader", "certificate": "ci.example"},
    ]
    return write_secret(path, json.dumps({"callers": callers}))


@pytest.fixture
async def guarded(settings: Settings, tmp_path: Path) -> AsyncIterator[RunningEngine]:
    """An engine that knows the callers of `TOKENS` (plaintext, on loopback)."""
    running = await start_engine(
        replace(settings, tokens_file=str(write_tokens(tmp_path / "tokens.json")))
    )
    try:
        yield running
    finally:
        await stop_engine(running)


def bearer(role: str | None, token: str | None = None) -> list[tuple[str, str]]:
    if token is not None:
        return [("authorization", token)]
    return [] if role is None else [("authorization", f"Bearer {TOKENS[role]}")]


Call = Callable[[pb_grpc.WorkflowEngineStub, list[tuple[str, str]]], Awaitable[Any]]


def calls(task_id: str) -> dict[str, Call]:
    """One call of every method about `task_id` (unknown to the engine unless started)."""

    async def watch(stub: pb_grpc.WorkflowEngineStub, md: list[tuple[str, str]]) -> Any:
        call = stub.WatchWorkflow(pb.WatchWorkflowRequest(task_id=task_id), metadata=md)
        return [e async for e in call]

    decision = pb.ApprovalDecision(step_id="s", verdict=pb.APPROVE)
    return {
        "StartWorkflow": lambda stub, md: stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=task(step("s", "true"))), metadata=md
        ),
        "ResumeWorkflow": lambda stub, md: stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(task_id=task_id), metadata=md
        ),
        "ResumeWorkflow with a decision": lambda stub, md: stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(task_id=task_id, decision=decision), metadata=md
        ),
        "GetWorkflow": lambda stub, md: stub.GetWorkflow(
            pb.GetWorkflowRequest(task_id=task_id), metadata=md
        ),
        "ListWorkflows": lambda stub, md: stub.ListWorkflows(
            pb.ListWorkflowsRequest(), metadata=md
        ),
        "WatchWorkflow": watch,
        "UpdateWorkflow": lambda stub, md: stub.UpdateWorkflow(
            pb.UpdateWorkflowRequest(
                task_id=task_id, operator="x", force_branch=pb.Branch.MARK_FAILED
            ),
            metadata=md,
        ),
        "CancelWorkflow": lambda stub, md: stub.CancelWorkflow(
            pb.CancelWorkflowRequest(task_id=task_id), metadata=md
        ),
    }


# Who may do what: True where the role's call reaches the service.
ALLOWED = {
    "orchestrator": set(calls("")),
    "operator": set(calls("")) - {"StartWorkflow", "ResumeWorkflow"},
    "reader": {"GetWorkflow", "ListWorkflows", "WatchWorkflow"},
}


async def code_of(call: Awaitable[Any]) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_every_method_by_role_and_credentials(guarded: RunningEngine, db_url: str) -> None:
    existing = new_task_id()
    await guarded.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=existing, task=task(step("s", "true"))),
        metadata=bearer("orchestrator"),
    )
    await wait_for_status(guarded.stub, existing, metadata=bearer("reader"))
    before = await snapshot(db_url)
    refused: dict[tuple[str, str], grpc.StatusCode] = {}
    for who, md in [
        ("nobody", bearer(None)),
        ("a wrong token", bearer(None, "Bearer not-a-known-token-at-all")),
        ("no Bearer scheme", bearer(None, TOKENS["orchestrator"])),
        ("Basic", bearer(None, "Basic " + TOKENS["orchestrator"])),
        ("two headers", bearer("orchestrator") + bearer("reader")),
        ("a huge token", bearer(None, "Bearer " + "x" * 6000)),
    ]:
        for method, call in calls(existing).items():
            refused[who, method] = await code_of(call(guarded.stub, md))
    for role, allowed in ALLOWED.items():
        for method, call in calls(existing).items():
            if method not in allowed:
                refused[role, method] = await code_of(call(guarded.stub, bearer(role)))
    assert {k: v for k, v in refused.items() if k[0] in TOKENS and v != DENIED} == {}
    assert {k: v for k, v in refused.items() if k[0] not in TOKENS and v != NO_ENTRY} == {}
    assert await snapshot(db_url) == before  # nothing refused changed anything

    # What a role may call reaches the service: it answers as it would anyone.
    for role, allowed in ALLOWED.items():
        for method in sorted(allowed):
            code = await code_of(calls(new_task_id())[method](guarded.stub, bearer(role)))
            assert code not in (DENIED, NO_ENTRY), (role, method, code)


async def test_health_is_open_and_reflection_follows_its_setting(
    settings: Settings, tmp_path: Path
) -> None:
    tokens = str(write_tokens(tmp_path / "tokens.json"))
    for enabled in (True, False):
        running = await start_engine(replace(settings, tokens_file=tokens, reflection=enabled))
        try:
            health = health_pb2_grpc.HealthStub(running.channel)
            answer = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            stub = reflection_pb2_grpc.ServerReflectionStub(running.channel)
            ask = reflection_pb2.ServerReflectionRequest(list_services="")
            code = await code_of(_first(stub.ServerReflectionInfo(iter([ask]))))
            assert code == (grpc.StatusCode.OK if enabled else grpc.StatusCode.UNIMPLEMENTED)
        finally:
            await stop_engine(running)


async def _first(stream: Any) -> Any:
    async for item in stream:
        return item


async def test_the_recorded_actor_is_the_authenticated_caller(guarded: RunningEngine) -> None:
    orchestrator, operator = bearer("orchestrator"), bearer("operator")
    gated = new_task_id()
    spec = task(step("ship", "true", requires_approval=True))
    await guarded.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=gated, task=spec), metadata=orchestrator
    )
    waiting = {pb.WAITING_FOR_APPROVAL}
    await wait_for_status(guarded.stub, gated, waiting, metadata=orchestrator)
    decision = pb.ApprovalDecision(step_id="ship", verdict=pb.APPROVE, decided_by="mallory")
    await guarded.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(task_id=gated, decision=decision), metadata=operator
    )
    wf = await wait_for_status(guarded.stub, gated, metadata=orchestrator)
    decided = [e for e in wf.history if e.kind == pb.APPROVAL_DECIDED]
    assert [e.actor for e in decided] == ["alice (request says mallory)"]

    for_override = new_task_id()
    slow = task(step("wait", "sleep", "30"))
    await guarded.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=for_override, task=slow), metadata=orchestrator
    )
    await guarded.stub.UpdateWorkflow(
        pb.UpdateWorkflowRequest(
            task_id=for_override, operator="alice", force_branch=pb.Branch.MARK_FAILED
        ),
        metadata=operator,
    )
    wf = await wait_for_status(guarded.stub, for_override, metadata=orchestrator)
    assert [e.actor for e in wf.history if e.kind == pb.OVERRIDDEN] == ["alice"]

    cancelled = new_task_id()
    await guarded.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=cancelled, task=slow), metadata=orchestrator
    )
    wf = await guarded.stub.CancelWorkflow(
        pb.CancelWorkflowRequest(task_id=cancelled, reason="not needed"), metadata=operator
    )
    assert wf.status == pb.CANCELLED
    wf = await guarded.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=cancelled), metadata=operator)
    cancels = [
        e.actor for e in wf.history if e.kind == pb.STATUS_CHANGED and e.status == pb.CANCELLED
    ]
    assert cancels == ["alice"]


# -- TLS ---------------------------------------------------------------------------------------


@pytest.fixture
def pki(tmp_path: Path) -> tuple[Authority, Authority]:
    """Our CA (server and client certificates) and another one nobody trusts."""
    return Authority(tmp_path / "pki", "our-ca"), Authority(tmp_path / "pki", "other-ca")


def tls_channel(address: str, ca: Authority, client: Any = None) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca.issued.cert_pem,
        private_key=client.key_pem if client else None,
        certificate_chain=client.cert_pem if client else None,
    )
    return grpc.aio.secure_channel(address.replace("127.0.0.1", "localhost"), credentials)


def with_tls(settings: Settings, ca: Authority, tmp_path: Path, **more: Any) -> Settings:
    """`settings` serving TLS with a certificate of `ca`, to the callers of `TOKENS`."""
    server = ca.server()
    return replace(
        settings,
        tls_cert_file=str(server.cert),
        tls_key_file=str(server.key),
        tokens_file=str(write_tokens(tmp_path / "tokens.json")),
        **more,
    )


async def test_tls_serves_only_tls_clients(
    settings: Settings, tmp_path: Path, pki: tuple[Authority, Authority]
) -> None:
    ours, _ = pki
    running = await start_engine(with_tls(settings, ours, tmp_path, health_listen="127.0.0.1:0"))
    try:
        # Probes that cannot speak TLS get health, and nothing else, on a port of their own.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{running.server.health_port}") as probe:
            answer = await health_pb2_grpc.HealthStub(probe).Check(health_pb2.HealthCheckRequest())
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            listing = pb_grpc.WorkflowEngineStub(probe).ListWorkflows(pb.ListWorkflowsRequest())
            assert await code_of(listing) == grpc.StatusCode.UNIMPLEMENTED
        plaintext = pb_grpc.WorkflowEngineStub(running.channel)  # the fixture's insecure channel
        code = await code_of(plaintext.ListWorkflows(pb.ListWorkflowsRequest(), timeout=5))
        assert code == grpc.StatusCode.UNAVAILABLE
        async with tls_channel(running.address, ours) as channel:
            stub = pb_grpc.WorkflowEngineStub(channel)
            listed = await stub.ListWorkflows(pb.ListWorkflowsRequest(), metadata=bearer("reader"))
            assert list(listed.workflows) == []
            code = await code_of(stub.ListWorkflows(pb.ListWorkflowsRequest()))
            assert code == NO_ENTRY  # TLS alone names no caller
    finally:
        await stop_engine(running)


async def test_mutual_tls_names_the_caller_by_its_certificate(
    settings: Settings, tmp_path: Path, pki: tuple[Authority, Authority], db_url: str
) -> None:
    ours, other = pki
    running = await start_engine(
        with_tls(settings, ours, tmp_path, tls_client_ca_file=str(ours.issued.cert))
    )
    try:
        before = await snapshot(db_url)
        async with tls_channel(running.address, ours, other.client("ci.example")) as channel:
            stub = pb_grpc.WorkflowEngineStub(channel)  # a certificate of a CA not trusted
            code = await code_of(stub.ListWorkflows(pb.ListWorkflowsRequest(), timeout=5))
            assert code == grpc.StatusCode.UNAVAILABLE
        async with tls_channel(running.address, ours) as channel:
            stub = pb_grpc.WorkflowEngineStub(channel)  # no certificate at all
            code = await code_of(stub.ListWorkflows(pb.ListWorkflowsRequest(), timeout=5))
            assert code == grpc.StatusCode.UNAVAILABLE
        async with tls_channel(running.address, ours, ours.client("ci.example")) as channel:
            stub = pb_grpc.WorkflowEngineStub(channel)  # ci-runner, a reader
            assert list((await stub.ListWorkflows(pb.ListWorkflowsRequest())).workflows) == []
            start = pb.StartWorkflowRequest(task_id=new_task_id(), task=task(step("s", "true")))
            assert await code_of(stub.StartWorkflow(start)) == DENIED
        async with tls_channel(running.address, ours, ours.client("stranger")) as channel:
            stub = pb_grpc.WorkflowEngineStub(channel)  # trusted, but not a known caller
            assert await code_of(stub.ListWorkflows(pb.ListWorkflowsRequest())) == NO_ENTRY
        assert await snapshot(db_url) == before
    finally:
        await stop_engine(running)


async def test_serving_beyond_loopback_needs_tls_and_callers(
    settings: Settings,
    tmp_path: Path,
    pki: tuple[Authority, Authority],
) -> None:
    exposed = replace(settings, listen="0.0.0.0:0")
    with pytest.raises(ValueError, match="ALLOW_INSECURE_REMOTE") as refused:
        exposed.check_exposure()
    assert "no TLS and no callers" in str(refused.value)
    server = pki[0].server()
    tls_only = replace(exposed, tls_cert_file=str(server.cert), tls_key_file=str(server.key))
    with pytest.raises(ValueError, match="no callers"):
        tls_only.check_exposure()
    replace(tls_only, tokens_file=str(write_tokens(tmp_path / "t.json"))).check_exposure()
    replace(exposed, allow_insecure_remote=True).check_exposure()

    # The command refuses before it starts anything (no database, no port).
    env = {
        **os.environ,
        "WORKFLOW_ENGINE_LISTEN": "0.0.0.0:50999",
        "WORKFLOW_ENGINE_DATA_DIR": str(tmp_path / "never"),
    }
    proc = await asyncio.create_subprocess_exec(
        str(ENGINE), "serve", env=env, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    assert "ALLOW_INSECURE_REMOTE" in stderr.decode()
    assert not (tmp_path / "never").exists()
