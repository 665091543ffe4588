"""A workflow's status: its names, and the sets that say what each means to the engine.

The names are the strings stored in ``workflow_checkpoints.status`` and ``workflow_events``, and
the names of the proto's ``WorkflowStatus`` values; a `WorkflowStatus` member is equal to, and
hashes as, its stored string, so stored rows compare with these sets as plain strings do. The
workflow state (the checkpoint's JSON) spells them in lower case: `in_state` and `of_state`
convert, and nothing else spells a status.
"""

from __future__ import annotations

from enum import StrEnum


class WorkflowStatus(StrEnum):
    """Every status a workflow row can hold, spelt as it is stored."""

    RUNNING = "RUNNING"
    WAITING_FOR_APPROVAL = "WAITING_FOR_APPROVAL"
    SUSPENDED = "SUSPENDED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def in_state(self) -> str:
        """The spelling of the workflow state's ``status`` field (``running``)."""
        return str.lower(self)  # not `self.value`: Enum's descriptor is slow, and this is hot

    @classmethod
    def of_state(cls, value: object) -> WorkflowStatus:
        """The status a state's ``status`` field names; a state without one is RUNNING."""
        try:
            return _BY_STATE_SPELLING[value or "running"]  # type: ignore[index]
        except (KeyError, TypeError):
            raise ValueError(f"unknown workflow status {value!r}") from None


# Every node's checkpoint converts its status: a dict lookup, not Enum's slower call.
_BY_STATE_SPELLING = {status.in_state: status for status in WorkflowStatus}


# The sets hold the plain stored strings (`.value`), so whatever iterates them sees what it
# always saw.
#: Finished: a resume or a cancel leaves the workflow as it is.
TERMINAL_STATUSES: frozenset[str] = frozenset(
    {WorkflowStatus.SUCCEEDED.value, WorkflowStatus.FAILED.value, WorkflowStatus.CANCELLED.value}
)
#: Not finished, but waiting for someone: a decision, or a raised budget.
PAUSED_STATUSES: frozenset[str] = frozenset(
    {WorkflowStatus.WAITING_FOR_APPROVAL.value, WorkflowStatus.SUSPENDED.value}
)
#: Statuses a run's last checkpoint leaves: the write that stores one releases the lease.
FINAL_STATUSES: frozenset[str] = TERMINAL_STATUSES | PAUSED_STATUSES

#: The error of a workflow marked FAILED because automatic recovery claimed it too often.
RECOVERY_EXHAUSTED = "recovery attempts exhausted"

#: Why the engine holds a workflow whose row another writer changed (`blocked_reason`).
OUTSIDE_CHANGE = (
    "its state or last_node_id was changed outside the engine, which will not run from it "
    "until an operator decides: UpdateWorkflow accept_outside_state re-plans from that state; "
    "force_branch MARK_FAILED or CancelWorkflow ends it"
)
