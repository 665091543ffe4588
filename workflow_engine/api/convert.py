"""Protobuf messages to the engine's types and back.

Parsing is also where request fields are checked for form (UUIDs, required fields); every
problem is an `InvalidArgument` naming the field as the client spelled it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from google.protobuf import json_format, struct_pb2, timestamp_pb2
from google.protobuf.descriptor import EnumDescriptor

from workflow_engine.domain.model import JsonObject, parse
from workflow_engine.domain.task import (
    CHECK_KINDS_NEEDING_EQUALS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_PARALLEL,
    Budget,
    TaskSpec,
)
from workflow_engine.errors import InvalidArgument
from workflow_engine.graph import commands
from workflow_engine.graph.commands import Branch, Change, Decision, Verdict
from workflow_engine.storage.records import WorkflowEventRecord, WorkflowRecord
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
    """The task a `TaskSpec` message describes; `InvalidArgument` names the field at fault.

    What only the message can tell (an absent `equals`, a Value with no kind) is checked here;
    everything else by the domain model, whose field paths are the message's.
    """
    data = {
        "prompt": msg.prompt,
        "acceptance_criteria": [
            {
                "description": c.description,
                "check": (
                    _check(c.check, f"task.acceptance_criteria[{i}].check")
                    if c.HasField("check")
                    else None
                ),
            }
            for i, c in enumerate(msg.acceptance_criteria)
        ],
        "steps": [_step(s, i) for i, s in enumerate(msg.steps)],
        "preferences": [
            _to_json(layer, f"task.preferences[{i}]") for i, layer in enumerate(msg.preferences)
        ],
        "metadata": {
            "user_id": msg.metadata.user_id,
            "project_id": msg.metadata.project_id,
            "labels": dict(msg.metadata.labels),
        },
        "max_attempts_per_step": msg.max_attempts_per_step or DEFAULT_MAX_ATTEMPTS,
        "budget": _budget(msg.budget),
        "max_parallel_steps": msg.max_parallel_steps or DEFAULT_MAX_PARALLEL,
    }
    task: TaskSpec = parse(TaskSpec, data, "task")
    return task


def budget_from_proto(msg: pb.Budget) -> Budget:
    budget: Budget = parse(Budget, _budget(msg), "budget")
    return budget


def _budget(msg: pb.Budget) -> JsonObject:
    return {
        "max_dispatches": msg.max_dispatches,
        "max_consecutive_attempts": msg.max_consecutive_attempts,
        "deadline_seconds": msg.deadline_seconds,
    }


def _step(msg: pb.Step, index: int) -> JsonObject:
    return {
        "id": msg.id or f"step-{index + 1}",
        "description": msg.description,
        "command": list(msg.command),
        "env": dict(msg.env),
        "timeout_seconds": msg.timeout_seconds,
        "depends_on": list(msg.depends_on),
        "requires_approval": msg.requires_approval,
        "expect": [_check(c, f"task.steps[{index}].expect[{j}]") for j, c in enumerate(msg.expect)],
        "image": msg.image,
    }


def _check(msg: pb.Check, where: str) -> JsonObject:
    """A check; `equals` absent and `equals` JSON null differ here, and only here.

    The domain `Check` holds JSON, where both would be `None`, so a check whose kind needs an
    `equals` is refused when the message has none; a JSON null arrives as a Value with
    `null_value` set. A Value with no kind set is no value (the Value message calls it an error).
    """
    check = {"kind": msg.kind, "value": msg.value, "field": msg.field, "equals": None}
    if not msg.HasField("equals"):
        if msg.kind in CHECK_KINDS_NEEDING_EQUALS:
            raise InvalidArgument(
                f"{where}.equals", f"required for {msg.kind} (JSON null is written null)"
            )
        return check
    if msg.equals.WhichOneof("kind") is None:
        raise InvalidArgument(f"{where}.equals", "a Value with no kind set")
    return {**check, "equals": _to_json(msg.equals, f"{where}.equals")}


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
        pending_approval=approval_to_proto(record.state),
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


MAX_REASON_CHARS = 4096
_VERDICTS: dict[int, Verdict] = {pb.APPROVE: "approve", pb.REJECT: "reject", pb.EDIT: "edit"}
_BRANCHES: dict[int, Branch] = {
    pb.FINALIZE_SUMMARY: "finalize_summary",
    pb.MARK_FAILED: "mark_failed",
}
T = TypeVar("T")


def parse_enum(
    value: int, enum: EnumDescriptor, accepted: Mapping[int, T], field: str, noun: str
) -> T:
    """A request's enum field as the engine's value.

    0 (..._UNSPECIFIED) is what an unset field reads as, so it is "required"; a number the
    contract does not define (a proto3 enum field carries it as it is) is named as unknown.
    """
    if value in accepted:
        return accepted[value]
    names = [enum.values_by_number[number].name for number in accepted]
    expected = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
    if value == 0:
        raise InvalidArgument(field, f"required: {expected}")
    if value not in enum.values_by_number:
        raise InvalidArgument(field, f"unknown {noun} {value}")
    raise InvalidArgument(field, f"{enum.values_by_number[value].name} is not accepted: {expected}")


def approval_to_proto(state: Any) -> pb.ApprovalRequest | None:
    """The pending approval request in a workflow's state, if it has one."""
    request = state.get("pending_approval") if isinstance(state, dict) else None
    if not isinstance(request, dict):
        return None
    requested_at = request.get("requested_at")
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
    )


def parse_text(value: str, field: str, *, limit: int, required: bool = False) -> str:
    """A free-text field: bounded, without NUL or other control characters but newlines."""
    if required and not value.strip():
        raise InvalidArgument(field, "required")
    if len(value) > limit:
        raise InvalidArgument(field, f"longer than {limit} characters")
    if any(ord(ch) < 32 and ch not in "\n\t" for ch in value):
        raise InvalidArgument(field, "contains control characters")
    return value


def decision_from_proto(msg: pb.ApprovalDecision) -> Decision:
    """ResumeWorkflow's `decision`, refused field by field when malformed."""
    verdict = parse_enum(
        msg.verdict, pb.Verdict.DESCRIPTOR, _VERDICTS, "decision.verdict", "verdict"
    )
    step_id = parse_text(msg.step_id, "decision.step_id", limit=256, required=True)
    reason = parse_text(
        msg.reason, "decision.reason", limit=MAX_REASON_CHARS, required=verdict == "reject"
    )
    decided_by = parse_holder_id(msg.decided_by) if msg.decided_by else ""
    if verdict == "edit" and not msg.command and not msg.env:
        raise InvalidArgument("decision.command", "EDIT needs a new command or env")
    if verdict != "edit" and (msg.command or msg.env):
        raise InvalidArgument("decision.command", "only EDIT may change the command or env")
    for i, arg in enumerate(msg.command):
        if "\x00" in arg:
            raise InvalidArgument(f"decision.command[{i}]", "contains a NUL character")
    for key, value in msg.env.items():
        if "\x00" in key or "\x00" in value or "=" in key or not key:
            raise InvalidArgument(f"decision.env[{key!r}]", "is not a valid variable")
    return Decision(
        step_id=step_id,
        verdict=verdict,
        reason=reason,
        command=tuple(msg.command),
        env=dict(msg.env),
        decided_by=decided_by,
    )


def update_from_proto(msg: pb.UpdateWorkflowRequest) -> Change:
    """UpdateWorkflow's action, as a change of the current state (see graph.commands)."""
    operator = parse_text(msg.operator, "operator", limit=256, required=True)
    reason = parse_text(msg.reason, "reason", limit=MAX_REASON_CHARS)
    action = msg.WhichOneof("action")
    if action == "set_state":
        patch = _to_json(msg.set_state, "set_state")
        return lambda state: commands.set_state(state, patch, operator, reason)
    if action == "reject_last_result":
        return lambda state: commands.reject_last_result(state, operator, reason)
    if action == "force_branch":
        branch = parse_enum(
            msg.force_branch, pb.Branch.DESCRIPTOR, _BRANCHES, "force_branch", "branch"
        )
        return lambda state: commands.force_branch(state, branch, operator, reason)
    raise InvalidArgument("action", "required: set_state, reject_last_result or force_branch")
