"""No answer tells a tenant that a guess of its is another tenant's secret.

Found in issue 61's own round (finding b). Attacker: tenant B (``b-orchestrator``), who wants to
know whether a string is one of tenant A's secrets. The engine used to mask every text a caller
reads with every secret it had met, of every workflow: so B's own words came back as
``[secret]`` exactly when they were one of A's. B could send a guess as a task id (the error
quotes it) or have its job print it (the verifier's findings, the workflow's error and summary,
its events and its list entry quote the output), and read the answer.

The promise: what a caller reads of a workflow is masked with that workflow's own secrets and
the engine's credentials only (`secrets.for_workflow`); an error with the credentials only. The
engine's log still masks every secret it knows (its reader is the operator).
"""

from __future__ import annotations

import uuid

import grpc
import pytest
from google.protobuf import json_format

from tests.conftest import RunningEngine
from tests.security.conftest import as_caller, tenant_task
from tests.security.test_secrets import shown_strings
from tests.support.helpers import check, new_task_id, shell_step, wait_for_status
from workflow_engine._masking import MASK
from workflow_engine.v1 import workflow_engine_pb2 as pb

A = as_caller("a-orchestrator")
B = as_caller("b-orchestrator")


async def test_a_tenant_cannot_test_a_guess_against_another_tenants_secrets(
    served: RunningEngine,
) -> None:
    secret = "a-secret-" + uuid.uuid4().hex
    a_id = new_task_id()
    a_task = tenant_task(
        "project-a", shell_step("use", "true", env={"TOKEN": secret}, secret_env=["TOKEN"])
    )
    await served.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=a_id, task=a_task), metadata=A)
    assert (await wait_for_status(served.stub, a_id, metadata=A)).status == pb.SUCCEEDED

    # The guess as a task id: the error quotes it as B sent it.
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await served.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=secret), metadata=B)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert secret in (refused.value.details() or ""), refused.value.details()

    # The guess printed by B's job, which fails: quoted by the findings, the error, the
    # summary, the events and the list entry.
    b_id = new_task_id()
    guess = f"echo {secret}; echo {secret} >&2; exit 3"
    b_task = tenant_task(
        "project-b", shell_step("guess", guess, expect=[check("stdout_contains", "nope")])
    )
    await served.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=b_id, task=b_task), metadata=B)
    wf = await wait_for_status(served.stub, b_id, metadata=B)
    assert wf.status == pb.FAILED
    listed = await served.stub.ListWorkflows(
        pb.ListWorkflowsRequest(project_id="project-b"), metadata=B
    )
    watch = served.stub.WatchWorkflow(pb.WatchWorkflowRequest(task_id=b_id), metadata=B)
    events = [e async for e in watch]
    texts = list(shown_strings([wf, listed, *events]))
    masked = [t for t in texts if MASK in t]
    assert not masked, f"B's own output came back masked: {masked[0][:300]}"
    findings = json_format.MessageToDict(wf.state)["steps"]["guess"]["verification"]["findings"]
    assert any(secret in f["detail"] for f in findings), findings
    assert secret in wf.error, wf.error

    # A's own answers still mask it.
    a_wf = await served.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=a_id), metadata=A)
    assert secret not in str(a_wf) and MASK in str(a_wf.state)
