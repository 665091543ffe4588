"""The engine's values as protobuf messages: workflows, events, approval requests.

Requests go the other way in `api._requests`, which checks them.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from workflow_engine._masking import (
    STATE_FIELD,
    EngineSecrets,
    for_workflow,
    redact_json,
    state_secrets,
)
from workflow_engine.domain.deadlines import expiry_of
from workflow_engine.domain.records import WorkflowEventRecord, WorkflowRecord
from workflow_engine.domain.values import JsonObject
from workflow_engine.v1 import workflow_engine_pb2 as pb


def to_struct(data: Any) -> struct_pb2.Struct:
    """A JSON object as a Struct; anything else (a hand-edited row) as an empty one."""
    struct = struct_pb2.Struct()
    if isinstance(data, dict):
        json_format.ParseDict(data, struct)
    return struct


def to_timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def status_to_proto(name: str) -> pb.WorkflowStatus.ValueType:
    """The enum value of a stored status; an unknown one (a hand-edited row) is UNSPECIFIED."""
    try:
        return pb.WorkflowStatus.Value(name)
    except ValueError:
        return pb.WORKFLOW_STATUS_UNSPECIFIED


def workflow_to_proto(
    record: WorkflowRecord,
    history: Iterable[WorkflowEventRecord] = (),
    *,
    engine_secrets: EngineSecrets,
) -> pb.Workflow:
    """The workflow (with `history`) as answers show it: its secrets and the engine's masked
    (`shown_state`, `shown_text`)."""
    secrets = state_secrets(record.state)
    state = shown_state(record.state, secrets, engine_secrets=engine_secrets)
    return pb.Workflow(
        task_id=record.task_id,
        run_id=record.run_id or "",
        status=status_to_proto(record.status),
        last_node_id=record.last_node_id or "",
        state=to_struct(state),
        updated_at=to_timestamp(record.updated_at),
        lease_holder_id=record.lease_holder_id or "",
        lease_expires_at=to_timestamp(record.lease_expires_at),
        summary=shown_text(record.summary, secrets, engine_secrets),
        error=shown_text(record.error, secrets, engine_secrets),
        pending_approval=approval_to_proto(state),
        blocked_reason=record.blocked_reason,
        stopped_reason=record.stopped_reason,
        schedule_id=record.schedule_id,
        schedule_slot=to_timestamp(record.schedule_slot),
        history=[
            event_to_proto(record.task_id, event, secrets, engine_secrets=engine_secrets)
            for event in history
        ],
    )


#: The most steps a state shown on the event loop may have (`cheap_to_show`).
INLINE_STEPS = 64


def cheap_to_show(state: JsonObject) -> bool:
    """Whether showing `state` is cheap enough for the event loop: no secret of its own to
    mask, and at most `INLINE_STEPS` steps. Masking costs follow the number of secrets (a
    task may have 256) times the strings shown, so such a state is shown off the loop."""
    if not isinstance(state, dict):
        return True
    plan = state.get("plan")
    steps = plan.get("steps") if isinstance(plan, dict) else None
    if isinstance(steps, list) and len(steps) > INLINE_STEPS:
        return False
    return not state_secrets(state)


def shown_state(
    state: JsonObject, secrets: set[str] | None = None, *, engine_secrets: EngineSecrets
) -> JsonObject:
    """A workflow's state as answers show it: without the values of its secrets (the state's
    `secrets` field), and with them and the engine's own credentials masked (see
    `workflow_engine._masking`)."""
    found = state_secrets(state) if secrets is None else secrets
    if isinstance(state, dict) and STATE_FIELD in state:
        state = {k: v for k, v in state.items() if k != STATE_FIELD}
    shown: JsonObject = engine_secrets.credentials.redact_json(
        redact_json(state, found) if found else state
    )
    return shown


def shown_text(text: str, secrets: set[str], engine_secrets: EngineSecrets) -> str:
    """A workflow's text (summary, error, an event's detail) with its `secrets` and the
    engine's credentials masked (`for_workflow`: never another workflow's)."""
    return for_workflow(engine_secrets, secrets).redact(text)


# `workflow_events.kind` as stored -> the EventKind clients see; the one place that maps them.
EVENT_KINDS: dict[str, pb.EventKind.ValueType] = {
    "node": pb.NODE_COMPLETED,
    "status": pb.STATUS_CHANGED,
    "approval_requested": pb.APPROVAL_REQUESTED,
    "approval_decided": pb.APPROVAL_DECIDED,
    "overridden": pb.OVERRIDDEN,
    "blocked": pb.BLOCKED,
    "stopped": pb.STOPPED,
}


def event_to_proto(
    task_id: str,
    event: WorkflowEventRecord,
    secrets: set[str] | None = None,
    *,
    engine_secrets: EngineSecrets,
) -> pb.WorkflowEvent:
    """A stored event as WatchWorkflow and GetWorkflow's history send it, with the workflow's
    `secrets` (when the caller has its state) and the engine's masked.

    A kind not in `EVENT_KINDS` (a hand-edited row) is EVENT_KIND_UNSPECIFIED.
    """
    return pb.WorkflowEvent(
        task_id=task_id,
        sequence=event.seq,
        kind=EVENT_KINDS.get(event.kind, pb.EVENT_KIND_UNSPECIFIED),
        node_id=event.node_id or "",
        status=status_to_proto(event.status),
        time=to_timestamp(event.created_at),
        run_id=event.run_id or "",
        detail=shown_text(event.detail, secrets or set(), engine_secrets),
        actor=event.actor,
    )


def approval_to_proto(state: Any) -> pb.ApprovalRequest | None:
    """The pending approval request in a workflow's state, if it has one."""
    request = state.get("pending_approval") if isinstance(state, dict) else None
    if not isinstance(request, dict):
        return None
    requested_at = request.get("requested_at")
    # As the timer sweep judges it: the deadline of the budget as it is now.
    expiry = expiry_of(state)
    return pb.ApprovalRequest(
        step_id=str(request.get("step_id", "")),
        description=str(request.get("description", "")),
        command=[str(a) for a in request.get("command") or ()],
        env={str(k): str(v) for k, v in dict(request.get("env") or {}).items()},
        reason=str(request.get("reason", "")),
        requested_at=(
            to_timestamp(datetime.fromtimestamp(float(requested_at), UTC))
            if isinstance(requested_at, int | float)
            else None
        ),
        expires_at=(
            to_timestamp(datetime.fromtimestamp(expiry.at, UTC)) if expiry is not None else None
        ),
        on_timeout=(
            _TIMEOUT_ACTIONS[expiry.action]
            if expiry is not None
            else pb.ApprovalTimeout.ACTION_UNSPECIFIED
        ),
    )


_TIMEOUT_ACTIONS = {"reject": pb.ApprovalTimeout.REJECT, "suspend": pb.ApprovalTimeout.SUSPEND}
