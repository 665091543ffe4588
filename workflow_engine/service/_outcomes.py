"""What the workflow service's changes answer with."""

from __future__ import annotations

from dataclasses import dataclass

from workflow_engine.domain.records import Lease, WorkflowRecord


@dataclass(frozen=True, slots=True)
class ResumeOutcome:
    record: WorkflowRecord
    lease: Lease | None
    resumed: bool
    #: The status the workflow has, or is bound for, after the call (see `Applied.status`).
    status: str


@dataclass(frozen=True, slots=True)
class Applied:
    """Changes made durable: the row after them, the lease taken for them (if a claim was
    needed), and the status the workflow has or is committed to (a forced `mark_failed` is
    FAILED even before that node has run)."""

    record: WorkflowRecord
    lease: Lease | None
    status: str
