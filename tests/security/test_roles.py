"""An operator is an attacker within its role: it changes exactly what the role table
(`workflow_engine.api._roles`; docs/security.md, "Callers and roles") says, field by field,
and a request that sets anything more is refused naming the field and changes nothing stored.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from tests.conftest import RunningEngine
from tests.security.conftest import as_caller, tenant_task
from tests.support.helpers import new_task_id, snapshot, step, struct, wait_for_status
from workflow_engine.api._roles import FIELDS, REQUIRED, ROLE_NAMES, ROLES
from workflow_engine.v1 import workflow_engine_pb2 as pb

DENIED = grpc.StatusCode.PERMISSION_DENIED
#: The caller of each role, all of project-a.
CALLER = {"orchestrator": "a-orchestrator", "operator": "a-operator", "reader": "a-reader"}
REQUESTS: dict[str, type[Message]] = {
    "StartWorkflow": pb.StartWorkflowRequest,
    "ResumeWorkflow": pb.ResumeWorkflowRequest,
    "UpdateWorkflow": pb.UpdateWorkflowRequest,
    "CancelWorkflow": pb.CancelWorkflowRequest,
}
#: The schedule requests, which name no task.
SCHEDULE_REQUESTS: dict[str, type[Message]] = {
    "CreateSchedule": pb.CreateScheduleRequest,
    "UpdateSchedule": pb.UpdateScheduleRequest,
    "DeleteSchedule": pb.DeleteScheduleRequest,
}
#: A value for each field that the service would take: what a refused request would have done.
VALUES: dict[str, Any] = {
    "holder_id": "operator-holder",
    "idempotency_key": "2f1d5c1e-7a5e-4d33-9d1b-3a8e0f6b2c10",
    "task": tenant_task("project-a", step("s", "true")),
    "lease_ttl_seconds": 86400,
    "decision": pb.ApprovalDecision(step_id="gate", verdict=pb.APPROVE),
    "budget": pb.Budget(max_dispatches=9_000_000),
    "operator": "mallory",
    "reason": "because",
    "set_state.preferences_effective": {"style": "terse"},
    "set_state.metadata": {"labels": {"seen": "yes"}},
    "set_state.summary": "edited",
    "set_state.plan": {"steps": [{"id": "gate", "command": ["/bin/sh", "-c", "id"]}]},
    "set_state.budget": {"max_dispatches": 9_000_000},
    "set_state.max_attempts_per_step": 100,
    "set_state.max_parallel_steps": 64,
    "reject_last_result": pb.RejectLastResult(),
    "force_branch": pb.FINALIZE_SUMMARY,
    "accept_outside_state": pb.AcceptOutsideState(),
    "schedule": pb.Schedule(cron="@every 1h", task=tenant_task("project-a", step("s", "true"))),
    "update_mask": ["paused"],
    "schedule_id": "5d6f3c1e-2b4a-4c8d-9e0f-1a2b3c4d5e6f",
}


def request(method: str, task_id: str, *names: str) -> Message:
    """`method`'s request for `task_id` setting `names` (and nothing else) to `VALUES`."""
    message = (
        REQUESTS[method](task_id=task_id) if method in REQUESTS else SCHEDULE_REQUESTS[method]()
    )
    state: dict[str, Any] = {}
    for name in names:
        if name == "task_id":
            continue
        value = VALUES[name]
        if name.startswith("set_state."):
            state[name.removeprefix("set_state.")] = value
        elif isinstance(value, Message):
            getattr(message, name).CopyFrom(value)
            getattr(message, name).SetInParent()
        elif isinstance(value, list):
            getattr(message, name).extend(value)
        else:
            setattr(message, name, value)
    if state:
        message.set_state.CopyFrom(struct(state))  # type: ignore[attr-defined]
    return message


async def call(
    served: RunningEngine, method: str, message: Message, role: str
) -> grpc.aio.AioRpcError | None:
    try:
        await getattr(served.stub, method)(message, metadata=as_caller(CALLER[role]))
    except grpc.aio.AioRpcError as exc:
        return exc
    return None


@pytest.fixture
async def waiting(served: RunningEngine) -> str:
    """A workflow of project-a waiting for approval of its step `gate`."""
    task_id = new_task_id()
    spec = tenant_task("project-a", step("gate", "true", requires_approval=True))
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=spec), metadata=as_caller("a-orchestrator")
    )
    await wait_for_status(
        served.stub, task_id, {pb.WAITING_FOR_APPROVAL}, metadata=as_caller("a-orchestrator")
    )
    return task_id


async def test_each_role_sets_exactly_the_fields_the_table_gives_it(
    served: RunningEngine, db_url: str, waiting: str
) -> None:
    """For each role, each changing request and each of its fields, a request setting that
    field (and what the role must send with it) is refused, naming the field, exactly when
    the table says the role may not set it; a refused one, aimed at a paused workflow it would
    have changed, changes nothing; an allowed one reaches the service."""
    refused: list[tuple[str, str, str]] = []
    allowed: list[tuple[str, str, str]] = []
    for role in ROLE_NAMES:
        for method, fields in FIELDS.items():
            for name, roles in fields.items():
                (allowed if role in roles else refused).append((role, method, name))
    assert refused and allowed

    before = await snapshot(db_url)
    wrong: list[tuple[str, str, str, str]] = []
    for role, method, name in refused:
        must = REQUIRED.get((role, method))
        error = await call(served, method, request(method, waiting, name, *[must or name]), role)
        if error is None or error.code() != DENIED:
            wrong.append((role, method, name, "not refused"))
        elif method in ROLES[role] and not error.details().startswith(f"{name}: "):
            wrong.append((role, method, name, error.details()))
    assert wrong == []
    assert await snapshot(db_url) == before, "a refused request changed something"

    for role, method, name in allowed:
        must = REQUIRED.get((role, method))
        error = await call(
            served, method, request(method, new_task_id(), name, *[must or name]), role
        )
        if error is not None and error.code() in (DENIED, grpc.StatusCode.UNAUTHENTICATED):
            wrong.append((role, method, name, error.details()))
    assert wrong == []


async def test_what_a_role_must_send_it_must_send(served: RunningEngine, waiting: str) -> None:
    for (role, method), must in REQUIRED.items():
        error = await call(served, method, request(method, waiting), role)
        assert error is not None and error.code() == DENIED
        assert error.details().startswith(f"{must}: required")


async def test_an_operators_decision_takes_no_budget_holder_or_lease(
    served: RunningEngine, db_url: str, waiting: str
) -> None:
    """The operator of issue 48, finding 10: its approval also raised max_dispatches to
    9,000,000 and took the lease under its own holder id for a day. Each is refused, naming the
    field; the decision alone is what an operator sends, and is taken."""
    operator = as_caller("a-operator")
    approve = pb.ApprovalDecision(step_id="gate", verdict=pb.APPROVE)
    before = await snapshot(db_url)
    for extra, field in [
        ({"budget": pb.Budget(max_dispatches=9_000_000)}, "budget"),
        ({"holder_id": "operator-holder"}, "holder_id"),
        ({"lease_ttl_seconds": 86400}, "lease_ttl_seconds"),
        (
            {
                "budget": pb.Budget(max_dispatches=9_000_000),
                "holder_id": "operator-holder",
                "lease_ttl_seconds": 86400,
            },
            "holder_id",
        ),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await served.stub.ResumeWorkflow(
                pb.ResumeWorkflowRequest(task_id=waiting, decision=approve, **extra),
                metadata=operator,
            )
        assert error.value.code() == DENIED
        assert error.value.details().startswith(f"{field}: ")
    plan = {"steps": [{"id": "gate", "command": ["/bin/sh", "-c", "id"]}]}
    for state in (struct({"plan": plan}), struct({"budget": {"max_dispatches": 9_000_000}})):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await served.stub.UpdateWorkflow(
                pb.UpdateWorkflowRequest(task_id=waiting, operator="a", set_state=state),
                metadata=operator,
            )
        assert error.value.code() == DENIED
        assert error.value.details().startswith("set_state.")
    assert await snapshot(db_url) == before

    answer = await served.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(task_id=waiting, decision=approve), metadata=operator
    )
    assert answer.resumed
    done = await wait_for_status(served.stub, waiting, metadata=operator)
    assert done.status == pb.SUCCEEDED, done.error
    assert done.state["budget"]["max_dispatches"] == 0
    assert [e.actor for e in done.history if e.kind == pb.APPROVAL_DECIDED] == ["a-operator"]


async def test_a_raised_budget_is_recorded_as_the_authenticated_caller(
    served: RunningEngine,
) -> None:
    """The recorded actor is who authenticated, not the holder id the request names."""
    orchestrator = as_caller("a-orchestrator")
    task_id = new_task_id()
    spec = tenant_task("project-a", step("one", "true"), step("two", "true"))
    spec.budget.max_dispatches = 1
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=spec), metadata=orchestrator
    )
    await wait_for_status(served.stub, task_id, {pb.SUSPENDED}, metadata=orchestrator)
    await served.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(
            task_id=task_id, holder_id="someone-else", budget=pb.Budget(max_dispatches=2)
        ),
        metadata=orchestrator,
    )
    done = await wait_for_status(served.stub, task_id, metadata=orchestrator)
    assert done.status == pb.SUCCEEDED, done.error
    raised = [e for e in done.history if e.kind == pb.OVERRIDDEN and e.node_id == "budget_update"]
    assert [e.actor for e in raised] == ["a-orchestrator"]
