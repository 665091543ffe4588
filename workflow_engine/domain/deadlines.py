"""When a wait for approval ends without an answer: the step's (or the task's) approval timeout,
or the workflow's deadline, whichever comes first.

Pure functions of a workflow's state (its JSON) and of the time, which the callers pass in
(`now`, from the engine's clock): the node that asks for approval stores the expiry with the
request, the checkpoint write copies it to the row's `wake_at` (where the timer sweep finds it,
on whichever replica is alive), and the change that applies it checks it again against the
state it is applied to (`graph.changes.expire`), so a row whose `wake_at` is wrong can wake
the sweep but never make a request expire early.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

#: What happens to a step whose approval request expires.
TimeoutAction = Literal["reject", "suspend"]
#: Why a wait ends: the approval request's own timeout, or the workflow's deadline.
ExpiryCause = Literal["approval_timeout", "deadline"]

TIMEOUT_ACTIONS: tuple[TimeoutAction, ...] = ("reject", "suspend")
#: The longest approval timeout a step or task may ask for (a leap year).
MAX_APPROVAL_TIMEOUT_SECONDS = 366 * 86400
#: The actor an expiry is recorded with.
DEADLINE_ACTOR = "deadline"
#: The state's status while a workflow waits (`WorkflowStatus.WAITING_FOR_APPROVAL.in_state`).
_WAITING = "waiting_for_approval"


@dataclass(frozen=True, slots=True)
class Expiry:
    """When a wait ends, what happens then, and why."""

    at: float
    action: TimeoutAction
    cause: ExpiryCause
    #: The seconds the request waits (approval timeout), or the deadline's (deadline).
    seconds: int


def approval_expiry(
    *,
    requested_at: float,
    timeout_seconds: int,
    action: TimeoutAction,
    started_at: float | None,
    deadline_seconds: int,
) -> Expiry | None:
    """The earlier of `requested_at + timeout_seconds` and `started_at + deadline_seconds`
    (each only when set, non-zero); None when neither is. The deadline wins a tie: it always
    suspends."""
    timed: Expiry | None = None
    if timeout_seconds > 0:
        timed = Expiry(requested_at + timeout_seconds, action, "approval_timeout", timeout_seconds)
    if deadline_seconds > 0:
        start = requested_at if started_at is None else started_at
        at = start + deadline_seconds
        if timed is None or at <= timed.at:
            return Expiry(at, "suspend", "deadline", deadline_seconds)
    return timed


def effective_timeout(
    step_seconds: int,
    step_action: str | None,
    task_seconds: int,
    task_action: str | None,
) -> tuple[int, TimeoutAction]:
    """A step's approval timeout and action: its own, else the task's; the action defaults to
    reject."""
    seconds = step_seconds or task_seconds
    chosen = step_action or task_action
    return seconds, ("suspend" if chosen == "suspend" else "reject")


def expiry_of(state: Mapping[str, Any]) -> Expiry | None:
    """The expiry of the approval request a state waits on (None when it waits on none, or
    the request never expires): the timeout stored with the request (`timeout_seconds`,
    `timeout_action`) from its request time, and the deadline of the state's budget as it is
    now (an operator may have raised it since the request's `expires_at` was stored)."""
    if state.get("status") != _WAITING:
        return None
    pending = state.get("pending_approval")
    if not isinstance(pending, Mapping):
        return None
    requested_at = _number(pending.get("requested_at"))
    if requested_at is None:
        return None
    budget = state.get("budget")
    deadline = _number(budget.get("deadline_seconds")) if isinstance(budget, Mapping) else None
    action = pending.get("timeout_action")
    return approval_expiry(
        requested_at=requested_at,
        timeout_seconds=int(_number(pending.get("timeout_seconds")) or 0),
        action="suspend" if action == "suspend" else "reject",
        started_at=_number(state.get("started_at")),
        deadline_seconds=int(deadline or 0),
    )


def wake_at(state: Mapping[str, Any]) -> float | None:
    """When a row holding `state` must be looked at again without anyone asking: its pending
    request's expiry; None for a row that runs, has ended, or waits forever."""
    expiry = expiry_of(state)
    return None if expiry is None else expiry.at


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
