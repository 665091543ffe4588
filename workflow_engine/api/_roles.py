"""What each role may change: a list, field by field, of every request that changes something.

This table is the one definition of the roles. The interceptor (`api._auth`) refuses a request
that sets a field its caller's role may not set, with PERMISSION_DENIED naming the field,
before the service sees it, so a refused request changes nothing. The table of roles in
docs/security.md is `markdown_table()` (``python -m workflow_engine.api._roles`` prints it; a
test checks that the page has it).

An orchestrator may set everything. An operator decides approvals (ResumeWorkflow with a
decision, which is all it may send there), overrides (UpdateWorkflow) and cancels; budgets,
holder ids and lease times are the orchestrator's, and so are the plan and the limits in a
`set_state`: an operator changes a plan only through a decision (approve, reject, or edit the
step that waits), a person's answer to the request the command policy or the task made. A
reader only reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ORCHESTRATOR = "orchestrator"
OPERATOR = "operator"
READER = "reader"
ROLE_NAMES = (ORCHESTRATOR, OPERATOR, READER)

#: Methods that change nothing: every role may call them with any field.
READ = frozenset({"GetWorkflow", "ListWorkflows", "WatchWorkflow", "GetSchedule", "ListSchedules"})

_ORCHESTRATOR = frozenset({ORCHESTRATOR})
_DECIDES = frozenset({ORCHESTRATOR, OPERATOR})

#: Method -> field (as a client spells it; `set_state` by the state key it sets) -> the roles
#: that may set it. A role may call a method when it may set one of its fields.
FIELDS: Mapping[str, Mapping[str, frozenset[str]]] = {
    "StartWorkflow": {
        "task_id": _ORCHESTRATOR,
        "holder_id": _ORCHESTRATOR,
        "idempotency_key": _ORCHESTRATOR,
        "task": _ORCHESTRATOR,
        "lease_ttl_seconds": _ORCHESTRATOR,
    },
    "ResumeWorkflow": {
        "task_id": _DECIDES,
        "decision": _DECIDES,
        "holder_id": _ORCHESTRATOR,
        "lease_ttl_seconds": _ORCHESTRATOR,
        "budget": _ORCHESTRATOR,
    },
    "UpdateWorkflow": {
        "task_id": _DECIDES,
        "operator": _DECIDES,
        "reason": _DECIDES,
        "set_state.preferences_effective": _DECIDES,
        "set_state.metadata": _DECIDES,
        "set_state.summary": _DECIDES,
        "set_state.plan": _ORCHESTRATOR,
        "set_state.budget": _ORCHESTRATOR,
        "set_state.max_attempts_per_step": _ORCHESTRATOR,
        "set_state.max_parallel_steps": _ORCHESTRATOR,
        "reject_last_result": _DECIDES,
        "force_branch": _DECIDES,
        "accept_outside_state": _DECIDES,
    },
    "CancelWorkflow": {"task_id": _DECIDES, "reason": _DECIDES},
    # Schedules start workflows: the orchestrator's, as starts are.
    "CreateSchedule": {"schedule": _ORCHESTRATOR},
    "UpdateSchedule": {"schedule": _ORCHESTRATOR, "update_mask": _ORCHESTRATOR},
    "DeleteSchedule": {"schedule_id": _ORCHESTRATOR},
}
#: (role, method) -> the field without which that role may not send it: an operator's
#: ResumeWorkflow answers an approval; continuing a workflow under a lease is the
#: orchestrator's.
REQUIRED: Mapping[tuple[str, str], str] = {(OPERATOR, "ResumeWorkflow"): "decision"}
#: Why a field is another role's, said when it is refused.
_WHY = {
    "holder_id": "holder ids are the orchestrator's",
    "lease_ttl_seconds": "lease times are the orchestrator's",
    "budget": "budgets are the orchestrator's",
    "set_state.budget": "budgets are the orchestrator's",
    "set_state.max_attempts_per_step": "limits are the orchestrator's",
    "set_state.max_parallel_steps": "limits are the orchestrator's",
    "set_state.plan": (
        "the plan is the orchestrator's; an operator changes a step by a decision "
        "(ResumeWorkflow with EDIT) when it waits for approval"
    ),
}

#: What each role may call, by method name of `workflow_engine.v1.WorkflowEngine`.
ROLES: Mapping[str, frozenset[str]] = {
    role: READ | {m for m, fields in FIELDS.items() if any(role in r for r in fields.values())}
    for role in ROLE_NAMES
}


def fields_set(request: Any) -> list[str]:
    """The fields `request` (a message of a method of `FIELDS`) sets, as `FIELDS` names them."""
    names: list[str] = []
    if not hasattr(request, "ListFields"):
        return names  # an undecodable request: the service refuses it
    for descriptor, value in request.ListFields():
        if descriptor.name == "set_state":
            names += [f"set_state.{key}" for key in value.fields] or ["set_state"]
        else:
            names.append(descriptor.name)
    return names


def refusal(role: str, method: str, request: Any) -> str | None:
    """Why `role` may not send `request` to `method`, naming the field; None when it may.

    A field the table does not know (a state key that is no editable one) is left to the
    request's parser, which refuses it as INVALID_ARGUMENT.
    """
    fields = FIELDS.get(method)
    if fields is None:
        return None
    given = fields_set(request)
    for name in given:
        allowed = fields.get(name)
        if allowed is not None and role not in allowed:
            why = _WHY.get(name)
            return f"{name}: a caller of role {role} may not set it in {method}" + (
                f"; {why}" if why else ""
            )
    required = REQUIRED.get((role, method))
    if required is not None and required not in given:
        return f"{required}: required of a caller of role {role} in {method}"
    return None


def markdown_table() -> str:
    """docs/security.md's table of roles: every field of every changing request, per role."""
    lines = [
        "| request | field | " + " | ".join(f"`{r}`" for r in ROLE_NAMES) + " |",
        "| --- | --- |" + " --- |" * len(ROLE_NAMES),
    ]
    for method, fields in FIELDS.items():
        for name, roles in fields.items():
            cells = []
            for role in ROLE_NAMES:
                cell = "may" if role in roles else "may not"
                if REQUIRED.get((role, method)) == name:
                    cell = "must"
                cells.append(cell)
            lines.append(f"| `{method}` | `{name}` | " + " | ".join(cells) + " |")
    reads = ", ".join(f"`{m}`" for m in sorted(READ))
    lines.append(f"| {reads} | any | " + " | ".join(["may"] * len(ROLE_NAMES)) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
