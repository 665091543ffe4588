"""Changes made to a workflow from outside its nodes: approval decisions, raised budgets and an
operator's overrides.

Each is a pure function from the current state to a `StateUpdate`: the state keys to write and
how the change is recorded. The run applies it as if `verify_step_result` had returned it (see
`runtime._run`): one fenced checkpoint (the change, with its event) whose next node that node's
router chooses from the changed state. So a decision, a budget or an override is durable before
anything acts on it, and is recorded in the history.

Everything refused here raises `InvalidState` (FAILED_PRECONDITION) or `InvalidArgument`
before anything is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workflow_engine._masking import MASK, state_secrets, step_secrets
from workflow_engine.domain.deadlines import DEADLINE_ACTOR, expiry_of
from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.domain.steps import MAX_SECRET_CHARS, MAX_SECRETS
from workflow_engine.domain.task import STEPS, Budget, Step
from workflow_engine.domain.values import parse
from workflow_engine.errors import InvalidArgument, InvalidState
from workflow_engine.graph import routing
from workflow_engine.graph.state import (
    ApprovalRecord,
    BudgetRecord,
    FindingRecord,
    PendingApproval,
    PlanRecord,
    VerificationRecord,
    WorkflowState,
    as_record,
    parse_state,
)
from workflow_engine.graph.state import Branch as Branch  # re-exported: the API's values
from workflow_engine.graph.state import Verdict as Verdict

#: The node whose router continues the graph after an update.
CONTINUE_FROM = "verify_step_result"


@dataclass(frozen=True, slots=True)
class StateUpdate:
    """State keys to write, and the event that records who wrote them and why."""

    values: WorkflowState
    label: str  # recorded as the event's node and the row's last_node_id
    kind: str  # approval_decided | overridden
    detail: str
    actor: str


#: A change from outside, as a function of the state it is applied to: it returns the update,
#: or raises `InvalidState` / `InvalidArgument` when that state does not allow it. The run that
#: applies it calls it on the state of its latest checkpoint, so a change that a concurrent one
#: made obsolete is refused instead of applied twice.
Change = Callable[[WorkflowState], StateUpdate]


@dataclass(frozen=True, slots=True)
class Override:
    """An operator's UpdateWorkflow: who, why, and what.

    `change` is a change of the current state (set_state, reject_last_result, force_branch),
    applied by the run holding the lease. A blocked workflow (another writer changed its row)
    takes no such change; only `fails` (force_branch MARK_FAILED) or `accept_outside_state`
    decide about it.
    """

    actor: str
    reason: str
    change: Change | None = None
    fails: bool = False
    accept_outside_state: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    """An answer to a pending approval request (ResumeWorkflow's `decision`)."""

    step_id: str
    verdict: Verdict
    reason: str = ""
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    decided_by: str = ""


def apply_all(
    changes: Sequence[Change], state: WorkflowState
) -> tuple[list[StateUpdate], WorkflowState]:
    """Each change's update, each computed from the state the ones before it leave, and the
    state after them all. Raises (changing nothing) when one does not fit its state."""
    updates = []
    for change in changes:
        update = change(state)
        state = {**state, **update.values}
        updates.append(update)
    return updates, state


def _pending(state: WorkflowState, step_id: str, field: str) -> PendingApproval:
    """The request `state` waits on, for `step_id`; `InvalidState` naming `field` otherwise."""
    pending = state.get("pending_approval")
    if state.get("status") != WorkflowStatus.WAITING_FOR_APPROVAL.in_state or not pending:
        raise InvalidState(
            f"{field}: the workflow has no pending approval request "
            f"(status {str(state.get('status', '')).upper()})"
        )
    if step_id != pending.get("step_id"):
        raise InvalidState(
            f"{field}.step_id: the pending request is for step {pending.get('step_id')!r}, "
            f"not {step_id!r}"
        )
    return pending


def decide(state: WorkflowState, decision: Decision, now: float) -> StateUpdate:
    """Apply `decision` to the workflow's pending approval request (decided at `now`)."""
    _pending(state, decision.step_id, "decision")
    sid = decision.step_id
    actor = decision.decided_by or "unknown"
    record: ApprovalRecord = {
        "verdict": decision.verdict,
        "reason": decision.reason,
        "decided_by": actor,
        "decided_at": now,
    }
    values: WorkflowState = {
        "status": WorkflowStatus.RUNNING.in_state,
        "pending_approval": None,
        "approvals": {**state.get("approvals", {}), sid: record},
    }
    if decision.verdict == "reject":
        steps = dict(state.get("steps", {}))
        steps[sid] = {
            **routing.step_state(state, sid),
            "status": "failed",
            "error": f"rejected by {actor}: {decision.reason}",
        }
        values["steps"] = steps
    elif decision.verdict == "edit":
        values["plan"] = _edited_plan(state, decision)
        record["command"] = list(decision.command)
        record["env"] = dict(decision.env)
    detail = f"{decision.verdict} step {sid}" + (f": {decision.reason}" if decision.reason else "")
    return StateUpdate(values, "approval_decision", "approval_decided", detail, actor)


def expire(state: WorkflowState, step_id: str, now: float) -> StateUpdate:
    """End the wait of `state` for `step_id`'s approval because it expired at or before `now`
    (the timer sweep's change; see `runtime._deadlines`).

    Refused (`InvalidState`, nothing written) unless the state waits on that step's request
    and that request's expiry, as the state itself says (`domain.deadlines.expiry_of`), has
    come: so a decision and an expiry that race are applied once between them, and a row
    whose `wake_at` says otherwise never makes a request expire early. REJECT is recorded like
    a person's rejection, by actor "deadline": the step fails, and so does the workflow.
    SUSPEND (the step's action, or the workflow's deadline) leads to `suspend_workflow`, whose
    summary says why; the step asks again when the workflow is resumed.
    """
    pending = _pending(state, step_id, "expiry")
    expiry = expiry_of(state)
    if expiry is None:
        raise InvalidState(f"expiry: the approval request of step {step_id} never expires")
    if now < expiry.at:
        raise InvalidState(
            f"expiry: the approval request of step {step_id} expires in "
            f"{expiry.at - now:.3f} s, not yet"
        )
    waited = round(now - float(pending.get("requested_at") or now))
    values: WorkflowState = {
        "status": WorkflowStatus.RUNNING.in_state,
        "pending_approval": None,
    }
    if expiry.cause == "deadline":
        reason = (
            f"the deadline of {expiry.seconds} s after the start passed while step {step_id} "
            f"waited for approval ({waited} s)"
        )
    else:
        reason = f"the approval request of step {step_id} expired after {expiry.seconds} s"
    if expiry.action == "reject":
        values["approvals"] = {
            **state.get("approvals", {}),
            step_id: {
                "verdict": "reject",
                "reason": reason,
                "decided_by": DEADLINE_ACTOR,
                "decided_at": now,
            },
        }
        steps = dict(state.get("steps", {}))
        steps[step_id] = {**routing.step_state(state, step_id), "status": "failed", "error": reason}
        values["steps"] = steps
    else:
        values["wait_expired"] = {"step_id": step_id, "cause": expiry.cause, "reason": reason}
    detail = f"{expiry.action} step {step_id}: {reason}"
    return StateUpdate(values, "approval_expiry", "approval_decided", detail, DEADLINE_ACTOR)


def resume_after_expiry(state: WorkflowState, actor: str) -> StateUpdate:
    """Continue a workflow SUSPENDED because its approval request expired (no budget needed):
    the step asks for approval again, with a new expiry."""
    expired = state.get("wait_expired") or {}
    if state.get("status") != WorkflowStatus.SUSPENDED.in_state or (
        expired.get("cause") != "approval_timeout"
    ):
        raise InvalidState(
            "budget: required; the workflow was not suspended by an expired approval request"
        )
    values: WorkflowState = {"status": WorkflowStatus.RUNNING.in_state, "wait_expired": None}
    detail = f"resumed after the approval request of step {expired.get('step_id')} expired"
    return StateUpdate(values, "resume", "overridden", detail, actor)


def _edited_plan(state: WorkflowState, decision: Decision) -> PlanRecord:
    plan: PlanRecord = {**state.get("plan", {})}
    steps = []
    for data in routing.plan_steps(state):
        if data["id"] == decision.step_id:
            step = Step.from_json(data)
            data = {
                **data,
                "command": list(decision.command or step.command),
                "env": {**step.env, **_edited_env(step, decision.env)},
            }
        steps.append(data)
    parse(STEPS, steps, "decision")
    plan["steps"] = steps
    return plan


def _edited_env(step: Step, env: Mapping[str, str]) -> dict[str, str]:
    """An EDIT decision's `env` for `step`: a secret sent as shown (`MASK`) keeps its value; one
    sent with any value at all is refused, its own included (an operator may not change a
    secret, would not be shown the value it set, and may not test a guess of it either)."""
    edited = dict(env)
    for name in step.secret_env:
        if name not in edited:
            continue
        if edited[name] == MASK:
            del edited[name]
        else:
            raise InvalidArgument(
                f"decision.env[{name}]",
                f"would change the value of the secret {name} of step {step.id}; leave it out "
                f"or send it as shown ({MASK})",
            )
    return edited


def raise_budget(state: WorkflowState, budget: Budget, actor: str) -> StateUpdate:
    """Replace the limits `budget` sets; continues a SUSPENDED workflow."""
    current = Budget.from_json(state.get("budget") or {})
    raised = current.raised_by(budget)
    values: WorkflowState = {"budget": as_record(BudgetRecord, raised)}
    if state.get("status") == WorkflowStatus.SUSPENDED.in_state:
        values["status"] = WorkflowStatus.RUNNING.in_state
        values["wait_expired"] = None  # resumed: a suspension by an expired wait is over too
    detail = "budget: " + ", ".join(f"{k}={v}" for k, v in raised.to_json().items() if v)
    return StateUpdate(values, "budget_update", "overridden", detail, actor)


def set_state(
    state: WorkflowState, values: Mapping[str, Any], actor: str, reason: str
) -> StateUpdate:
    """Replace editable top-level state keys with `values`, whose form the API checked
    (`api._requests.parse_state_patch`); a new plan must keep every step that passed or runs,
    and every secret of the steps it keeps (see `_plan_keeping_secrets`)."""
    values = dict(values)
    if "plan" in values:
        _check_plan_keeps_settled_steps(state, values["plan"])
        values["plan"] = _plan_keeping_secrets(state, values["plan"])
    detail = "set " + ", ".join(sorted(values)) + (f": {reason}" if reason else "")
    typed = parse_state(values, "set_state")
    return StateUpdate(typed, "operator_override", "overridden", detail, actor)


def reject_last_result(state: WorkflowState, actor: str, reason: str) -> StateUpdate:
    """Treat the last verified or collected result as failed: its step gets one more attempt."""
    sid = state.get("last_step_id") or ""
    current = routing.step_state(state, sid) if sid else None
    if current is None or current["status"] not in ("collected", "passed", "pending", "failed"):
        raise InvalidState("reject_last_result: the workflow has no result to reject")
    finding: FindingRecord = {
        "check": "operator",
        "passed": False,
        "detail": f"result rejected by {actor}" + (f": {reason}" if reason else ""),
    }
    verification: VerificationRecord = {
        "status": "fail",
        "findings": [finding],
        "recommended_actions": [finding["detail"]],
    }
    steps = dict(state.get("steps", {}))
    steps[sid] = {**current, "status": "pending", "verification": verification, "error": ""}
    results = [r for r in state.get("results", []) if r.get("step_id") != sid]
    context = {k: v for k, v in state.get("context", {}).items() if k != sid}
    plan = routing.plan_steps(state)
    first_open = next(
        (i for i, s in enumerate(plan) if steps.get(s["id"], {}).get("status") != "passed"),
        len(plan),
    )
    values: WorkflowState = {
        "steps": steps,
        "results": results,
        "context": context,
        "verification": verification,
        "current_step_index": first_open,
        "status": WorkflowStatus.RUNNING.in_state,
        "error": "",
    }
    # One more attempt than the step has had, whatever its limit was.
    attempts = int(current.get("attempts", 0))
    if attempts >= int(state.get("max_attempts_per_step", 1)):
        values["max_attempts_per_step"] = attempts + 1
    detail = f"rejected the last result of step {sid}" + (f": {reason}" if reason else "")
    return StateUpdate(values, "operator_override", "overridden", detail, actor)


def force_branch(state: WorkflowState, branch: Branch, actor: str, reason: str) -> StateUpdate:
    """Go to `finalize_summary` or `mark_failed` next."""
    values: WorkflowState = {"forced_next": branch, "status": WorkflowStatus.RUNNING.in_state}
    if branch == "mark_failed":
        values["error"] = f"failed by {actor}" + (f": {reason}" if reason else "")
    detail = f"forced {branch}" + (f": {reason}" if reason else "")
    return StateUpdate(values, "operator_override", "overridden", detail, actor)


#: The secrets a workflow keeps (its plans' together: a plan an operator replaces keeps the
#: old plan's, so that what they printed stays masked), and their characters, at most.
MAX_KEPT_SECRETS = 4 * MAX_SECRETS
MAX_KEPT_SECRET_CHARS = 4 * MAX_SECRET_CHARS


def _plan_keeping_secrets(state: WorkflowState, plan: Mapping[str, Any]) -> dict[str, Any]:
    """`plan` (an operator's edit of the plan they were shown) with each secret value shown as
    `MASK` put back; refused when a step it keeps (by id) would lose a secret, or a secret's
    value would change. A step dropped altogether takes its secrets out of the plan; the state
    keeps them, so what it printed stays masked."""
    current = {s["id"]: s for s in routing.plan_steps(state)}
    steps = []
    for i, data in enumerate(plan["steps"]):
        old = current.get(data["id"], {})
        old_env: Mapping[str, str] = old.get("env") or {}
        env = dict(data.get("env") or {})
        for name in old.get("secret_env") or ():
            if env.get(name) == MASK:
                env[name] = old_env.get(name, MASK)
            where = f"set_state.plan.steps[{i}]"
            if name not in (data.get("secret_env") or ()):
                raise InvalidArgument(
                    f"{where}.secret_env",
                    f"would drop the secret {name} of step {data['id']}; a secret stays one",
                )
            if env.get(name) != old_env.get(name):
                raise InvalidArgument(
                    f"{where}.env",
                    f"would change the value of the secret {name} of step {data['id']}; "
                    f"send it as shown ({MASK})",
                )
        steps.append({**data, "env": env} if env != (data.get("env") or {}) else data)
    kept = state_secrets(state) | step_secrets(steps)
    if len(kept) > MAX_KEPT_SECRETS or sum(map(len, kept)) > MAX_KEPT_SECRET_CHARS:
        raise InvalidArgument(
            "set_state.plan.steps",
            f"the workflow would keep more than {MAX_KEPT_SECRETS} secret values (or "
            f"{MAX_KEPT_SECRET_CHARS} characters of them), those of its earlier plans counted",
        )
    return {**plan, "steps": steps}


def _check_plan_keeps_settled_steps(state: WorkflowState, plan: Mapping[str, Any]) -> None:
    settled = {
        sid
        for sid, s in state.get("steps", {}).items()
        if s.get("status") in ("passed", "dispatched", "collected")
    }
    new = {step["id"] for step in plan["steps"]}
    if missing := sorted(settled - new):
        raise InvalidArgument(
            "set_state.plan.steps", f"would drop steps that passed or run: {missing}"
        )
