"""Every check of a request's form, at the API edge: each problem is an `InvalidArgument`
naming the field as the client spelled it (``task.steps[0].command``).

Messages become the engine's values here: a task, a budget or a plan through the domain model
(which checks its own invariants and names fields by the same paths), the rest (ids, text, enum
values, a state patch's form) by the parsers below. What depends on the stored workflow (is an
approval pending, would a plan drop a step that ran) is checked where the change is applied
(`graph.changes`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.descriptor import EnumDescriptor

from workflow_engine.api._auth import recorded_actor
from workflow_engine.api._convert import EVENT_KINDS
from workflow_engine.domain.deadlines import TimeoutAction
from workflow_engine.domain.task import (
    CHECK_KINDS_NEEDING_EQUALS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_PARALLEL,
    LOADER_PROBLEM,
    MAX_ATTEMPTS,
    MAX_PARALLEL,
    STEPS,
    Budget,
    TaskSpec,
    find_nul,
    loader_variables,
)
from workflow_engine.domain.values import JsonObject, parse
from workflow_engine.errors import InvalidArgument
from workflow_engine.graph import changes
from workflow_engine.graph.changes import Branch, Decision, Verdict
from workflow_engine.graph.state import STATE_KEYS
from workflow_engine.v1 import workflow_engine_pb2 as pb

MAX_HOLDER_ID_CHARS = 256
MAX_LEASE_TTL_SECONDS = 24 * 3600
MIN_LEASE_TTL_SECONDS = 3
MAX_REASON_CHARS = 4096
#: WatchWorkflow's `kinds` filter entries: each kind once, and room for kinds the contract may add.
MAX_EVENT_KINDS = 32
#: Fields one `set_state` may name: more than the state has (30), fewer than would cost.
MAX_SET_STATE_KEYS = 32


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


def parse_lease_ttl(value: int) -> int:
    """`lease_ttl_seconds`: 0 (the engine's setting) or a TTL within the bounds."""
    if value and not MIN_LEASE_TTL_SECONDS <= value <= MAX_LEASE_TTL_SECONDS:
        raise InvalidArgument(
            "lease_ttl_seconds",
            f"must be between {MIN_LEASE_TTL_SECONDS} and {MAX_LEASE_TTL_SECONDS}",
        )
    return value


def parse_reason(value: str) -> str:
    """CancelWorkflow's `reason`: bounded, and storable (no NUL)."""
    if len(value) > MAX_REASON_CHARS:
        raise InvalidArgument("reason", f"longer than {MAX_REASON_CHARS} characters")
    if "\x00" in value:
        raise InvalidArgument("reason", "contains a NUL character")
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
        "approval_timeout_seconds": msg.approval_timeout_seconds,
        "on_approval_timeout": _timeout_action(msg.on_approval_timeout, "task.on_approval_timeout"),
    }
    task: TaskSpec = parse(TaskSpec, data, "task")
    return task


def optional_task(request: pb.StartWorkflowRequest) -> TaskSpec | None:
    """StartWorkflow's `task`; `None` when absent (the engine then loads it by id)."""
    return task_from_proto(request.task) if request.HasField("task") else None


def budget_from_proto(msg: pb.Budget) -> Budget:
    budget: Budget = parse(Budget, _budget(msg), "budget")
    return budget


def _budget(msg: pb.Budget) -> JsonObject:
    return {
        "max_dispatches": msg.max_dispatches,
        "max_consecutive_attempts": msg.max_consecutive_attempts,
        "deadline_seconds": msg.deadline_seconds,
        "max_model_tokens": msg.max_model_tokens,
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
        "required_labels": list(msg.required_labels),
        "secret_env": list(msg.secret_env),
        "limits": {
            "cpu_seconds": msg.limits.cpu_seconds,
            "memory_mb": msg.limits.memory_mb,
            "open_files": msg.limits.open_files,
            "processes": msg.limits.processes,
            "output_mb": msg.limits.output_mb,
        },
        "approval_timeout_seconds": msg.approval_timeout_seconds,
        "on_approval_timeout": _timeout_action(
            msg.on_approval_timeout, f"task.steps[{index}].on_approval_timeout"
        ),
    }


_TIMEOUT_ACTIONS: dict[int, TimeoutAction] = {
    pb.ApprovalTimeout.REJECT: "reject",
    pb.ApprovalTimeout.SUSPEND: "suspend",
}


def _timeout_action(value: int, field: str) -> TimeoutAction | None:
    """An `ApprovalTimeout.Action`; unset (0) is None: the task's default, else reject."""
    if value == 0:
        return None
    return parse_enum(
        value, pb.ApprovalTimeout.Action.DESCRIPTOR, _TIMEOUT_ACTIONS, field, "action"
    )


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


def parse_event_kinds(values: Sequence[int]) -> frozenset[str] | None:
    """WatchWorkflowRequest.kinds as stored event kinds; None (every kind) when empty."""
    kinds = set()
    for i, value in enumerate(values):
        if value == pb.EVENT_KIND_UNSPECIFIED:
            raise InvalidArgument(f"kinds[{i}]", "EVENT_KIND_UNSPECIFIED is not an event kind")
        kinds.add(
            parse_enum(
                value, pb.EventKind.DESCRIPTOR, _EVENT_KIND_NAMES, f"kinds[{i}]", "event kind"
            )
        )
    return frozenset(kinds) or None


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
    decided_by = recorded_actor(parse_holder_id(msg.decided_by) if msg.decided_by else "")
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
    if refused := loader_variables(msg.env):
        raise InvalidArgument(f"decision.env[{refused[0]}]", LOADER_PROBLEM)
    return Decision(
        step_id=step_id,
        verdict=verdict,
        reason=reason,
        command=tuple(msg.command),
        env=dict(msg.env),
        decided_by=decided_by,
    )


def update_from_proto(msg: pb.UpdateWorkflowRequest) -> changes.Override:
    """UpdateWorkflow's action: who, why, and the change of the current state it makes (see
    graph.changes)."""
    operator = recorded_actor(parse_text(msg.operator, "operator", limit=256, required=True))
    reason = parse_text(msg.reason, "reason", limit=MAX_REASON_CHARS)
    action = msg.WhichOneof("action")
    if action == "set_state":
        values = parse_state_patch(_to_json(msg.set_state, "set_state"))
        return changes.Override(
            operator, reason, lambda state: changes.set_state(state, values, operator, reason)
        )
    if action == "reject_last_result":
        return changes.Override(
            operator, reason, lambda state: changes.reject_last_result(state, operator, reason)
        )
    if action == "force_branch":
        branch = parse_enum(
            msg.force_branch, pb.Branch.DESCRIPTOR, _BRANCHES, "force_branch", "branch"
        )
        return changes.Override(
            operator,
            reason,
            lambda state: changes.force_branch(state, branch, operator, reason),
            fails=branch == "mark_failed",
        )
    if action == "accept_outside_state":
        return changes.Override(operator, reason, accept_outside_state=True)
    raise InvalidArgument(
        "action",
        "required: set_state, reject_last_result, force_branch or accept_outside_state",
    )


#: State keys an operator may replace with UpdateWorkflow, and the JSON type each must have.
EDITABLE: dict[str, type] = {
    "preferences_effective": dict,
    "metadata": dict,
    "plan": dict,
    "max_attempts_per_step": int,
    "max_parallel_steps": int,
    "budget": dict,
    "summary": str,
}
#: EventKind -> `workflow_events.kind` as stored.
_EVENT_KIND_NAMES: dict[int, str] = {number: kind for kind, number in EVENT_KINDS.items()}
_LIMITS = {"max_attempts_per_step": MAX_ATTEMPTS, "max_parallel_steps": MAX_PARALLEL}
_TYPE_NAMES = {dict: "JSON object", int: "whole number", str: "string"}


def parse_state_patch(patch: Mapping[str, Any]) -> JsonObject:
    """UpdateWorkflow's `set_state`: editable keys only, each of its type; a plan and a budget
    as the domain model has them (a plan's steps are checked as a task's are)."""
    if not patch:
        raise InvalidArgument("set_state", "names no field")
    values: JsonObject = {}
    for key, value in patch.items():
        where = f"set_state.{key}"
        if key not in STATE_KEYS:
            raise InvalidArgument(where, "is not a state field")
        if key not in EDITABLE:
            raise InvalidArgument(where, f"cannot be edited; editable: {', '.join(EDITABLE)}")
        expected = EDITABLE[key]
        if expected is int and isinstance(value, float) and value.is_integer():
            value = int(value)  # a Struct carries every number as a double
        if not isinstance(value, expected) or isinstance(value, bool):
            raise InvalidArgument(where, f"must be a {_TYPE_NAMES[expected]}")
        if isinstance(value, int) and key in _LIMITS and not 1 <= value <= _LIMITS[key]:
            raise InvalidArgument(where, f"must be between 1 and {_LIMITS[key]}")
        nul = find_nul(value, where)
        if nul:
            raise InvalidArgument(nul, "contains a NUL character")
        values[key] = value
    if "plan" in values:
        values["plan"] = _plan_patch(values["plan"])
    if "budget" in values:
        values["budget"] = parse(Budget, values["budget"], "set_state.budget").to_json()
    return values


def _plan_patch(plan: JsonObject) -> JsonObject:
    """The plan with its steps in their stored form (defaults filled in); other keys kept."""
    raw = plan.get("steps")
    if not isinstance(raw, list) or not raw:
        raise InvalidArgument("set_state.plan.steps", "must be a non-empty list")
    steps = parse(STEPS, raw, "set_state.plan.steps")
    return {**plan, "steps": [step.to_json() for step in steps]}
