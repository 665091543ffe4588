"""What is known about a workflow, as storage reads it: its row, events, lease and fence,
start and resume outcomes, list queries and pages.

Plain frozen values that the storage layer builds from rows, the runtime and service pass on,
and the API converts to messages at its edge; none of them knows how it is stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from workflow_engine.domain.state_format import FIRST_STATE_FORMAT, readable
from workflow_engine.domain.status import TERMINAL_STATUSES
from workflow_engine.domain.values import JsonObject


@dataclass(frozen=True, slots=True)
class Fence:
    """What a runner proves on every write: it is `holder_id` at `epoch` for `task_id`."""

    task_id: str
    run_id: str
    holder_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Lease:
    task_id: str
    lease_id: str
    holder_id: str | None
    epoch: int
    expires_at: datetime | None
    live: bool
    #: The engine process that took it (`Settings.process_name`), if the engine took it.
    holder_process: str | None = None


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    """A task's workflow row joined with its lease."""

    task_id: str
    run_id: str
    status: str
    last_node_id: str | None
    state: JsonObject
    updated_at: datetime
    summary: str
    error: str
    idempotency_key: str | None
    event_seq: int
    has_checkpoint: bool
    lease_holder_id: str | None
    lease_expires_at: datetime | None
    #: Why the engine will not run this workflow until an operator decides ('' when it will):
    #: another writer changed its state or last_node_id.
    blocked_reason: str = ""
    #: Why its run stopped although it did not end ('' when it runs or ended): another writer
    #: released or took its lease. ResumeWorkflow continues it.
    stopped_reason: str = ""
    #: Whose it is: the task metadata's user and project.
    user_id: str = ""
    project_id: str = ""
    #: The state format of the row and the engine that last wrote it (`domain.state_format`).
    state_format: int = FIRST_STATE_FORMAT
    engine_version: str = ""
    #: The schedule that started it and the slot it was started for ('' / None otherwise).
    schedule_id: str = ""
    schedule_slot: datetime | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def readable(self) -> bool:
        """Whether this engine reads the row's state format (and so may change the row)."""
        return readable(self.state_format)


@dataclass(frozen=True, slots=True)
class StartOutcome:
    """How a start was answered, and the truth about the workflow it is about.

    STARTED: this call stored and leased it. ALREADY_RUNNING / ALREADY_FINISHED: its idempotency
    key started the workflow, which is not finished / finished; nothing changed. `lease` is the
    live lease on the task, `None` when none is (paused, finished, or its runner stopped).
    """

    status: Literal["STARTED", "ALREADY_RUNNING", "ALREADY_FINISHED"]
    run_id: str
    workflow_status: str
    lease: Lease | None
    #: STARTED: when its first event (status RUNNING, sequence 1) was stored.
    started_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class ResumeClaim:
    """The row a resume continues from, and the lease it now holds (`None`: nothing to run)."""

    record: WorkflowRecord
    lease: Lease | None


@dataclass(frozen=True, slots=True)
class WorkflowEventRecord:
    seq: int
    kind: str  # 'node', 'status', 'approval_requested', 'approval_decided', 'overridden'
    node_id: str | None
    status: str
    created_at: datetime
    run_id: str | None
    detail: str = ""  # what came of it, e.g. a verification's "pass" / "fail"
    actor: str = ""  # who caused it (decisions, overrides)


@dataclass(frozen=True, slots=True)
class Scope:
    """The workflows a caller may see and change: those whose task's project is one of
    `projects` and whose user is one of `users` (an empty set does not limit)."""

    projects: frozenset[str] = frozenset()
    users: frozenset[str] = frozenset()

    def admits(self, user_id: str, project_id: str) -> bool:
        return (not self.projects or project_id in self.projects) and (
            not self.users or user_id in self.users
        )

    def tenant(self, user_id: str, project_id: str) -> str:
        """The tenant a workflow this caller starts or resumes counts as (`tenant_of`)."""
        if self.users and not self.projects:
            return USER_TENANT + user_id
        return project_id


#: A tenant that is a user, not a project (NUL: no project id holds one, so none is mistaken).
USER_TENANT = "\x00user:"


def tenant_of(scope: Scope | None, user_id: str, project_id: str) -> str:
    """The key a workflow's runs and jobs are counted and shared under in an engine process
    (the per-tenant caps, the fair job slots): its project; but for a caller scoped to users
    only, which may name any project, its user, so that naming many projects gets it no more
    room. A run the engine starts by itself (recovery, an approval's expiry) counts under the
    project."""
    return project_id if scope is None else scope.tenant(user_id, project_id)


def tenant_shown(tenant: str) -> str:
    """`tenant` as a message names it: ``project 'p'`` or ``user 'u'``."""
    if tenant.startswith(USER_TENANT):
        return f"user {tenant.removeprefix(USER_TENANT)!r}"
    return f"project {tenant!r}"


@dataclass(frozen=True, slots=True)
class WorkflowQuery:
    """What ListWorkflows asks for; empty filters match everything."""

    statuses: tuple[str, ...] = ()
    user_id: str = ""
    project_id: str = ""
    updated_after: datetime | None = None  # inclusive
    updated_before: datetime | None = None  # exclusive
    limit: int = 50
    # Start after this (updated_at, task_id): the last row of the previous page.
    after: tuple[datetime, str] | None = None
    #: Only the workflows the caller may see (None: every one).
    scope: Scope | None = None
    #: Only the workflows this schedule started ('' matches every one).
    schedule_id: str = ""


@dataclass(frozen=True, slots=True)
class WorkflowListItem:
    """A workflow as ListWorkflows shows it: the row without its state, joined with its lease."""

    task_id: str
    run_id: str | None
    status: str
    last_node_id: str | None
    updated_at: datetime
    summary: str
    error: str
    lease_holder_id: str | None
    lease_expires_at: datetime | None
    stopped_reason: str = ""
    #: The schedule that started it and the slot it was started for ('' / None otherwise).
    schedule_id: str = ""
    schedule_slot: datetime | None = None


@dataclass(frozen=True, slots=True)
class WorkflowPage:
    items: Sequence[WorkflowListItem]
    # (updated_at, task_id) of the last item when more rows follow; None on the last page.
    next_after: tuple[datetime, str] | None
