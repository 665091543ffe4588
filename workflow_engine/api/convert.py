"""Protobuf messages to the engine's types and back.

Parsing is also where request fields are checked for form (UUIDs, required fields); every
problem is an `InvalidArgument` naming the field as the client spelled it.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from workflow_engine.errors import InvalidArgument
from workflow_engine.spec import (
    DEFAULT_MAX_ATTEMPTS,
    AcceptanceCriterion,
    Check,
    Step,
    TaskMetadata,
    TaskSpec,
)
from workflow_engine.storage.workflows import WorkflowEventRecord, WorkflowRecord
from workflow_engine.v1 import workflow_engine_pb2 as pb

MAX_HOLDER_ID_CHARS = 256


def parse_uuid(value: str, field: str, *, required: bool = True) -> str | None:
    """The canonical form of a UUID field; `None` for an empty optional one."""
    if not value:
        if required:
            raise InvalidArgument(field, "required")
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidArgument(field, f"not a UUID: {value[:64]!r}") from None


def parse_task_id(value: str) -> str:
    """The required `task_id` field, canonical."""
    task_id = parse_uuid(value, "task_id")
    assert task_id is not None  # required=True never returns None
    return task_id


def parse_holder_id(value: str) -> str:
    if len(value) > MAX_HOLDER_ID_CHARS:
        raise InvalidArgument("holder_id", f"longer than {MAX_HOLDER_ID_CHARS} characters")
    if any(ord(ch) < 32 for ch in value):
        raise InvalidArgument("holder_id", "contains control characters")
    return value


def task_from_proto(msg: pb.TaskSpec) -> TaskSpec:
    """Translate a `TaskSpec` message; `validate_task` then decides whether it can run."""
    return TaskSpec(
        prompt=msg.prompt,
        acceptance_criteria=tuple(
            AcceptanceCriterion(
                description=c.description,
                check=(
                    _check(c.check, f"task.acceptance_criteria[{i}].check")
                    if c.HasField("check")
                    else None
                ),
            )
            for i, c in enumerate(msg.acceptance_criteria)
        ),
        steps=tuple(_step(s, i) for i, s in enumerate(msg.steps)),
        preferences=tuple(
            _to_json(layer, f"task.preferences[{i}]") for i, layer in enumerate(msg.preferences)
        ),
        metadata=TaskMetadata(
            user_id=msg.metadata.user_id,
            project_id=msg.metadata.project_id,
            labels=dict(msg.metadata.labels),
        ),
        max_attempts_per_step=msg.max_attempts_per_step or DEFAULT_MAX_ATTEMPTS,
    )


def _step(msg: pb.Step, index: int) -> Step:
    return Step(
        id=msg.id or f"step-{index + 1}",
        description=msg.description,
        command=tuple(msg.command),
        env=dict(msg.env),
        timeout_seconds=msg.timeout_seconds,
        depends_on=tuple(msg.depends_on),
        requires_approval=msg.requires_approval,
        expect=tuple(
            _check(c, f"task.steps[{index}].expect[{j}]") for j, c in enumerate(msg.expect)
        ),
        image=msg.image,
    )


def _check(msg: pb.Check, where: str) -> Check:
    equals = _to_json(msg.equals, f"{where}.equals") if msg.HasField("equals") else None
    return Check(kind=msg.kind, value=msg.value, field=msg.field, equals=equals)


def _to_json(msg: Any, where: str) -> Any:
    """A Struct or Value as plain JSON; protobuf refuses Infinity and NaN, and so do we."""
    try:
        return json_format.MessageToDict(msg)
    except ValueError:
        raise InvalidArgument(where, "numbers must be finite (no Infinity or NaN)") from None


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


def workflow_to_proto(record: WorkflowRecord) -> pb.Workflow:
    return pb.Workflow(
        task_id=record.task_id,
        run_id=record.run_id or "",
        status=status_to_proto(record.status),
        last_node_id=record.last_node_id or "",
        state=to_struct(record.state),
        updated_at=to_timestamp(record.updated_at),
        lease_holder_id=record.lease_holder_id or "",
        lease_expires_at=to_timestamp(record.lease_expires_at),
        summary=record.summary,
        error=record.error,
    )


# `workflow_events.kind` as stored -> the EventKind clients see; the one place that maps them.
EVENT_KINDS: dict[str, pb.EventKind.ValueType] = {
    "node": pb.NODE_COMPLETED,
    "status": pb.STATUS_CHANGED,
    "approval_requested": pb.APPROVAL_REQUESTED,
    "approval_decided": pb.APPROVAL_DECIDED,
    "overridden": pb.OVERRIDDEN,
}


def event_to_proto(task_id: str, event: WorkflowEventRecord) -> pb.WorkflowEvent:
    """A stored event as WatchWorkflow and GetWorkflow's history send it.

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
        detail=event.detail,
        actor=event.actor,
    )
