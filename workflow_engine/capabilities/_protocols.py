"""The narrow interfaces each graph node calls, and the values that cross them.

Every node does its work through one capability, chosen by configuration: the embedded defaults
in this package work offline; real integrations (the orchestrator's tasks by id, an LLM planner,
the HTTP Worker API, an LLM judge) implement the same `Protocol`. `capabilities._factory` builds
the ones the settings name; one that owns resources is an async context manager, entered when
the engine starts and exited when it closes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from workflow_engine.domain.held import Held
from workflow_engine.domain.jobs import JobRequest, JobResult, Verification
from workflow_engine.domain.task import AcceptanceCriterion, Plan, Step, TaskSpec
from workflow_engine.domain.values import JsonObject
from workflow_engine.errors import InvalidArgument

if TYPE_CHECKING:  # the policy's module needs this one's `CapabilityConfigError`
    from workflow_engine.capabilities.model import PolicyDecision


class TaskSource(Protocol):
    """Loads a task by id from the orchestrator, for a StartWorkflow that sends none inline.

    Called once per start, before the lease is taken; the task as loaded is stored with the
    workflow, and the nodes read that stored copy (`StoredTasks`), never the source. A source
    that owns a connection (an MCP client) is an async context manager, opened with the engine.
    """

    #: Where it looks, as its `TaskNotFound` names it: a caller scoped to other projects or
    #: users is answered for another tenant's task in those same words.
    where: str

    async def load(self, task_id: str) -> TaskSpec:
        """The task, as the workflow will run it.

        Raise `TaskNotFound` (with `where`, and nothing the answer adds) when the orchestrator
        has no such task, `TaskNotStartable` (with the task's user and project) when it may not
        be started (closed, deleted, unreadable), `TaskSourceUnavailable` when the source cannot
        be asked, and `InvalidArgument` on ``task`` when there is no source to ask.
        """
        ...


class Planner(Protocol):
    """Turns a task into executable steps (`plan_steps`)."""

    async def plan(self, task: TaskSpec) -> Plan: ...

    def check(self, task: TaskSpec) -> None:
        """Raise `InvalidArgument` naming the field when `task` certainly cannot be planned.

        StartWorkflow calls it before anything is stored, so it must be cheap and pure: no I/O,
        no model call. Refuse only what this planner can tell up front (the static planner: no
        steps and no `$ command` lines); a task it might plan is accepted, and `plan` decides.
        """
        ...


@runtime_checkable
class RevisingPlanner(Protocol):
    """A planner that can rewrite a step from its failed verification (the ``llm`` one)."""

    async def revise(
        self, task: TaskSpec, step: Step, result: JobResult, verification: Verification
    ) -> tuple[Step, PolicyDecision]:
        """The step for its next attempt, and what the command policy decided about it.

        Raise a `WorkflowEngineError` when the revised command may not run at all.
        """
        ...


class Worker(Protocol):
    """Runs jobs (`dispatch_step` chooses the target, `collect_result` runs or re-attaches)."""

    def unfit(self, step: Step) -> tuple[str, str] | None:
        """Why `step` can never run on this worker, as (the step's field, the reason); None
        when it can (the local sandbox: not with an `image` or `required_labels`).

        Asked for a task's given steps by StartWorkflow, before anything is stored, and for
        each step a model plans; so it must be cheap and pure, like `Planner.check`. What may
        run some time (a label a node may join with) is not unfit.
        """
        ...

    async def select_target(self, job: JobRequest) -> str:
        """Name the node the job should run on; must not start anything."""
        ...

    async def run(self, target: str, job: JobRequest) -> JobResult:
        """Run the job on `target` and return its result.

        Idempotent by `job.job_id`: if the job already ran, or is still running after this
        process restarted, return (or wait for) that run's result; never run it twice.
        """
        ...

    async def cancel(self, target: str, job: JobRequest) -> None:
        """Stop the job (its workflow was cancelled) and record its result as `cancelled`.

        A job that has not started must then never start (a later `run` of its id returns the
        cancelled result); one that has ended keeps its result. Idempotent; returns without
        waiting for the job to be gone.
        """
        ...

    def held(self) -> list[Held]:
        """What it keeps in memory by job or task id (`domain.held`): entries that end with
        their jobs, and caches with a bound."""
        ...


#: Why a worker can never run a step: (the step's field, the reason), or None (`Worker.unfit`).
Unfit = Callable[[Step], tuple[str, str] | None]


def check_step(unfit: Unfit, step: Step, at: str) -> None:
    """Raise `InvalidArgument` naming ``{at}.<field>`` when the worker whose `unfit` this is can
    never run `step`."""
    why = unfit(step)
    if why:
        field, reason = why
        raise InvalidArgument(f"{at}.{field}", reason)


def check_steps(unfit: Unfit, steps: Sequence[Step], at: str) -> None:
    """`check_step` for each of `steps`, named ``{at}[i]``."""
    for i, step in enumerate(steps):
        check_step(unfit, step, f"{at}[{i}]")


class Verifier(Protocol):
    """Judges a step's result (`verify_step_result`)."""

    async def verify(
        self,
        step: Step,
        result: JobResult,
        criteria: Sequence[AcceptanceCriterion],
        preferences: Mapping[str, Any] | None = None,
        *,
        run_id: str = "",
        secrets: Collection[str] = (),
    ) -> Verification:
        """Check `result` against the step's checks and, when given, the task's criteria (and
        its effective preferences, for a verifier that can weigh them). `run_id` is the
        workflow run the result is of: a verifier that runs a job of its own runs it in that
        run (`JobRequest.run_id`). `secrets` are the workflow's: masked (with the engine's
        credentials, and no other workflow's secrets) in whatever it quotes or sends a
        model."""
        ...


class ContextCompressor(Protocol):
    """Keeps the context handed to a dispatch within a budget (seed 001's accumulated context)."""

    async def compress(self, entries: Sequence[JsonObject], budget_chars: int) -> list[JsonObject]:
        """`entries` (oldest first, each ``{"step_id", "output", ...}``) within `budget_chars`."""
        ...
