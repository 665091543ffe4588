"""The attacker's engine is locked: no credentials, no call; a tenant's caller, its tenant only."""

from __future__ import annotations

import grpc
import pytest

from tests.conftest import RunningEngine
from tests.security.conftest import as_caller, tenant_task
from tests.support.helpers import new_task_id, step
from workflow_engine.v1 import workflow_engine_pb2 as pb


async def test_no_credentials_no_call_and_a_tenant_starts_its_own_only(
    served: RunningEngine,
) -> None:
    request = pb.StartWorkflowRequest(
        task_id=new_task_id(), task=tenant_task("project-b", step("s", "true"))
    )
    with pytest.raises(grpc.aio.AioRpcError) as unauthenticated:
        await served.stub.StartWorkflow(request)
    assert unauthenticated.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.aio.AioRpcError) as other_tenant:
        await served.stub.StartWorkflow(request, metadata=as_caller("a-orchestrator"))
    assert other_tenant.value.code() == grpc.StatusCode.PERMISSION_DENIED
    started = await served.stub.StartWorkflow(request, metadata=as_caller("b-orchestrator"))
    assert started.status == pb.STARTED
