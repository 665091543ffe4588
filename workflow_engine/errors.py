"""The engine's one exception hierarchy: every error class of the package is here.

Callers match on type, never on message text. Each class carries the structured fields an
operator needs (task, holder, field); `workflow_engine.api._status_codes` maps them to gRPC
status codes in one place. Every configuration error is a `ConfigError` (a bad setting, a file
a setting names, an unknown capability): refused before anything serves.

Not here: the private control-flow exceptions a module raises and catches itself (`_Retry`,
`_Enough`, `_Refused`), and the fault suite's `faults.InjectedDatabaseError`, which must be a
psycopg error to be taken for a dropped connection.
"""

from __future__ import annotations

from datetime import datetime


class WorkflowEngineError(Exception):
    """Base class of every error the engine raises on purpose."""

    def __init__(self, message: str, *, task_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.task_id = task_id


class InvalidArgument(WorkflowEngineError):
    """A request field is malformed; `field` is its path, e.g. ``task.steps[0].command``."""

    def __init__(self, field: str, problem: str, *, task_id: str | None = None) -> None:
        super().__init__(f"{field}: {problem}", task_id=task_id)
        self.field = field
        self.problem = problem


class WorkflowNotFound(WorkflowEngineError):
    """No workflow is stored for the task."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task_id: no workflow for task {task_id}", task_id=task_id)


class ScheduleNotFound(WorkflowEngineError):
    """No schedule with that id (or none the caller may see: another tenant's reads the same)."""

    def __init__(self, schedule_id: str) -> None:
        super().__init__(f"schedule_id: no schedule {schedule_id}")


class ScheduleExists(WorkflowEngineError):
    """CreateSchedule with a schedule id that is taken."""

    def __init__(self, schedule_id: str) -> None:
        super().__init__(f"schedule.schedule_id: schedule {schedule_id} exists already")


class OutOfScope(WorkflowEngineError):
    """A caller scoped to some projects or users asked to start a workflow outside them."""


class TaskNotFound(WorkflowEngineError):
    """The orchestrator has no such task (its `tasks` table, a foreign key to it, or its task
    source said so); `where` names what was asked."""

    def __init__(self, task_id: str, where: str) -> None:
        super().__init__(f"task_id: task {task_id} not found in {where}", task_id=task_id)
        self.where = where


class TaskNotStartable(WorkflowEngineError):
    """The task exists but may not be started: closed, soft-deleted, or owned by another writer.

    `user_id` and `project_id` are the task's (as its metadata would have them; empty when
    unknown), so that a caller scoped to others is told no more than for a missing task.
    """

    def __init__(self, task_id: str, why: str, *, user_id: str = "", project_id: str = "") -> None:
        super().__init__(f"task_id: task {task_id} cannot be started: {why}", task_id=task_id)
        self.why = why
        self.user_id = user_id
        self.project_id = project_id


class TaskSourceUnavailable(WorkflowEngineError):
    """The task source could not be asked, or gave no usable answer (server down, timed out,
    refused the call, answered something that is not a task); retrying later may work."""

    def __init__(self, task_id: str, source: str, why: str) -> None:
        super().__init__(
            f"task_id: cannot load task {task_id} from {source}: {why}", task_id=task_id
        )
        self.source = source
        self.why = why


class NoEligibleNode(WorkflowEngineError):
    """No worker node could take a job within the dispatch's wait: the message says, node by
    node, why (labels it lacks, unhealthy, full). Fails the attempt, never the engine."""


class WorkflowExists(WorkflowEngineError):
    """StartWorkflow for a task that already has a workflow under another idempotency key."""

    def __init__(self, task_id: str, status: str) -> None:
        super().__init__(
            f"task_id: task {task_id} already has a workflow (status {status}); "
            "use ResumeWorkflow or GetWorkflow",
            task_id=task_id,
        )
        self.status = status


class LeaseHeld(WorkflowEngineError):
    """Another holder has a live lease on the task."""

    def __init__(
        self,
        task_id: str,
        holder_id: str | None,
        expires_at: datetime | None,
        process: str | None = None,
    ) -> None:
        expiry = expires_at.isoformat() if expires_at else "never"
        # The engine process is named when it says more than the holder (one of several).
        where = f" (engine process {process!r})" if process and process != holder_id else ""
        super().__init__(
            f"task {task_id} is leased by holder {holder_id!r}{where} until {expiry}",
            task_id=task_id,
        )
        self.holder_id = holder_id
        self.expires_at = expires_at


class InvalidState(WorkflowEngineError):
    """The request is well formed but the workflow is not in a state that allows it."""


class RunEnded(InvalidState):
    """A change reached a run that ended before applying it; nothing of it was written."""

    def __init__(self, task_id: str, outcome: str) -> None:
        super().__init__(
            f"the run ended ({outcome}) before the change was applied", task_id=task_id
        )


class UnreadableStateFormat(InvalidState):
    """The workflow's row is in a state format this engine does not read (a newer engine wrote
    it): nothing was changed; a replica of that engine can act on it."""

    def __init__(self, task_id: str, reason: str) -> None:
        super().__init__(f"workflow {task_id}: {reason}", task_id=task_id)
        self.reason = reason


class ResourceExhausted(WorkflowEngineError):
    """A caller or tenant holds as much of something as a setting allows (running workflows,
    open watches); `setting` names that setting's variable. Nothing was stored: retry later."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"{setting}: {problem}")
        self.setting = setting


class ShuttingDown(WorkflowEngineError):
    """This replica is draining and takes no new work; another replica should."""


class CheckpointCorrupt(WorkflowEngineError):
    """A stored checkpoint cannot be read back; nothing is executed from it."""


# -- Configuration: refused before the engine (or a worker node) serves anything -------------


class ConfigError(WorkflowEngineError, ValueError):
    """A setting, or a file a setting names, cannot be used; the message names the setting
    (its environment variable, or the file and the entry) and what is wrong with it.

    Every configuration error is one of these. It is also a `ValueError`, as the settings'
    errors always were, so code that catches `ValueError` around a setting (a dataclass's
    validation, the command line's arguments) keeps working."""


class CapabilityConfigError(ConfigError):
    """A capability's configuration cannot work (an unknown name, a bad nodes file); it stops
    the engine's start with the setting, and the entry, named."""


class UnknownCapability(CapabilityConfigError):
    """A setting names an implementation no registry has."""


class NodesFileError(CapabilityConfigError):
    """The nodes file cannot be read, or a node in it is not valid (named with its field)."""


class NodesTableMissing(CapabilityConfigError):
    """The ``orchestrator`` node source was chosen, and the database has no such tables."""


class AuthConfigError(ConfigError):
    """The tokens file or the TLS files cannot be used; the message names the setting."""


# -- Callers -----------------------------------------------------------------------------------


class Unauthenticated(WorkflowEngineError):
    """No credentials, or ones that name no caller (answered UNAUTHENTICATED by the API's
    interceptor)."""


class UsageError(WorkflowEngineError, ValueError):
    """A flag or file the command-line client cannot use; its message says which and why."""


# -- Tasks and their checks --------------------------------------------------------------------


class PatternError(WorkflowEngineError, ValueError):
    """A pattern RE2 will not run: its syntax, or its size."""


class LinkOut(WorkflowEngineError):
    """A path goes through a symbolic link that leads out of the directory it must stay in."""


# -- The model ---------------------------------------------------------------------------------


class ModelError(WorkflowEngineError):
    """The model gave no usable answer (after the retries, or for a reason no retry fixes)."""


class AnswerProblem(ModelError):
    """The model answered, but the answer cannot be read: cut at the token limit, or no JSON.
    Asked for again (`answer_valid`) like an answer that does not validate."""

    def __init__(self, reason: str, content: str, shown: str) -> None:
        """`shown`: `content` as the message quotes it (masked and cut: `Secrets.quoted`)."""
        super().__init__(f"{reason}: {shown}" if content else reason)
        self.reason = reason
        self.content = content


class PlanRefused(WorkflowEngineError):
    """The model planned a command the command policy denies."""


# -- Worker nodes ------------------------------------------------------------------------------


class UnreadableAnswer(WorkflowEngineError, ValueError):
    """A node answered 200 with something that is not a Worker API result for this job."""


class NodeInUse(WorkflowEngineError):
    """Another process serves a worker node from the same data directory."""


class AddressInUse(WorkflowEngineError):
    """The engine cannot listen where it is told to: another process (another engine, as
    likely as not) holds the address, or the host has no such address."""


class Unauthorized(WorkflowEngineError):
    """A request to a worker node carries no bearer token, or another one than the node's."""


class BodyTooLarge(WorkflowEngineError):
    """A request body is larger than the worker node accepts."""


class Draining(WorkflowEngineError):
    """The worker node is shutting down and takes no new job."""


class JobOfAnotherTask(WorkflowEngineError):
    """The request names a job_id that this worker node holds for another task."""

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"job {job_id} belongs to another task: a job_id is answered only for the task "
            "that first sent it (nothing was run or changed)"
        )


class RunControl(BaseException):
    """A signal that stops a run, not an error of the task.

    Derived from `BaseException`, as `asyncio.CancelledError` is, so that the `except Exception`
    of a node or a capability cannot catch it and turn a lost lease into a task failure. Only
    the run that drives the graph (and the API boundary, for a change that met one) handles it.
    """

    def __init__(self, message: str, *, task_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.task_id = task_id


class RunStopped(RunControl):
    """A run was asked to stop (cancel, shutdown, a change to apply) and did so."""

    def __init__(self, task_id: str, reason: str) -> None:
        super().__init__(f"run of task {task_id} stopped: {reason}", task_id=task_id)
        self.reason = reason


class LeaseLost(RunControl):
    """This runner no longer holds the lease it was fenced with; it must stop."""

    def __init__(self, task_id: str, holder_id: str, epoch: int) -> None:
        super().__init__(
            f"lease on task {task_id} lost by holder {holder_id!r} (epoch {epoch})",
            task_id=task_id,
        )
        self.holder_id = holder_id
        self.epoch = epoch


class OutsideWrite(RunControl):
    """The workflow's row was changed by another writer since the engine last wrote it (or is
    not the engine's): the run stops without writing, and the workflow waits for an operator."""

    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"the workflow row of task {task_id} was changed outside the engine", task_id=task_id
        )
