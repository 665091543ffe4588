"""Builds the capabilities the settings name, and opens and closes them with the engine.

Each kind (task source, planner, worker, verifier) has a setting that names its
implementation and a registry below mapping that name to a builder. The context compressor has
one implementation, `TruncatingCompressor`, which `Capabilities` makes itself: a kind gets a
setting and a registry when it gets a second implementation. A builder gets the
settings and what the engine lends capabilities (`Lent`: how to read a stored task, the
orchestrator's tasks table and its nodes table, and the engine's `EngineContext`: its secrets
and metrics), and returns the implementation. Adding one,
say an LLM planner, is one new module and one line here:

    PLANNERS = {"static": ..., "llm": lambda s, lent: LlmPlanner(s.llm)}

A capability that owns resources (HTTP clients, model clients) is an async context manager:
`opened` enters it when the engine starts and exits it, in reverse order, when the engine
closes. The embedded defaults own nothing and work offline.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from workflow_engine._context import EngineContext
from workflow_engine.capabilities._compressor import TruncatingCompressor
from workflow_engine.capabilities._job_tracker import JobTracker
from workflow_engine.capabilities._job_verifier import JobVerifier
from workflow_engine.capabilities._machine_verifier import MachineVerifier
from workflow_engine.capabilities._protocols import (
    ContextCompressor,
    Planner,
    TaskSource,
    Verifier,
    Worker,
    check_steps,
)
from workflow_engine.capabilities._static_planner import StaticPlanner
from workflow_engine.capabilities.model import (
    LlmPlanner,
    LlmVerifier,
    ModelClient,
    describe_workers,
    load_policy,
)
from workflow_engine.capabilities.tasks import InlineTaskSource, StoredTasks, TaskTableSource
from workflow_engine.capabilities.workers import (
    HttpWorker,
    LocalSandboxWorker,
    NodeTable,
    SimulatedWorker,
    load_nodes_file,
)
from workflow_engine.config import ENV_PREFIX, Settings
from workflow_engine.domain.task import TaskSpec
from workflow_engine.domain.values import JsonObject
from workflow_engine.errors import CapabilityConfigError, UnknownCapability
from workflow_engine.sandbox import Confinement, require_jobwrap

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The capability each node calls, and the task source StartWorkflow loads tasks from."""

    #: Where StartWorkflow loads a task by id when none is sent (configurable).
    task_source: TaskSource
    planner: Planner
    worker: Worker
    verifier: Verifier
    #: The task each workflow was started with, which the nodes read (not configurable).
    stored_tasks: StoredTasks
    #: The engine's one job tracker over `worker` (built with it): the steps' jobs and the
    #: `job` verifier's share its admission, its slots and its cancel.
    jobs: JobTracker
    #: What keeps the earlier steps' output handed to a dispatch within
    #: `context_budget_chars` (the one implementation; a program may replace it).
    compressor: ContextCompressor = field(default_factory=TruncatingCompressor)
    #: Characters of earlier steps' output handed to each dispatch, at most.
    context_budget_chars: int = 8000
    #: The model the ``llm`` planner and verifier share (opened with the engine); None when
    #: neither is configured.
    model: ModelClient | None = None
    #: Whether a failed verification has the planner revise the step (``llm`` planner only).
    revise_steps: bool = False
    #: Whether `finalize_summary` asks the model for the summary.
    model_summary: bool = False
    #: What the engine running these capabilities owns (the one their `Lent` carried): the
    #: nodes mask its secrets; an engine given these capabilities adopts it.
    context: EngineContext = field(default_factory=EngineContext)

    def check_startable(self, task: TaskSpec) -> None:
        """Raise `InvalidArgument` naming the field when `task` certainly cannot run: the
        planner cannot plan it, or the worker can never run one of its given steps."""
        self.planner.check(task)
        check_steps(self.worker.unfit, task.steps, "task.steps")


@dataclass(frozen=True, slots=True)
class Lent:
    """What the engine lends its capabilities: plain callables, never the engine's objects."""

    #: The task stored with a workflow (its JSON), by task id; raises `WorkflowNotFound`.
    stored_task: Callable[[str], Awaitable[JsonObject]]
    #: A row of the orchestrator's ``tasks`` table (as JSON), by task id; `None` when none.
    orchestrator_task: Callable[[str], Awaitable[JsonObject | None]]
    #: Whether the database has the orchestrator's ``tasks`` table.
    has_orchestrator_tasks: Callable[[], Awaitable[bool]]
    #: The orchestrator's ``nodes`` rows (as JSON, each with its latest capability snapshot);
    #: `None` when the database has no such table.
    orchestrator_nodes: Callable[[], Awaitable[list[JsonObject] | None]]
    #: The engine's model client, when a capability asks a model (built by the factory).
    model: ModelClient | None = None
    #: The worker the steps run on (set by the factory), for the ``job`` verifier's jobs.
    worker: Worker | None = None
    #: The engine's job tracker over that worker (set by the factory).
    jobs: JobTracker | None = None
    #: The engine's secrets and metrics (its fault plan too, which no capability uses).
    context: EngineContext = field(default_factory=EngineContext)


Builder = Callable[[Settings, Lent], T]


def _task_table(lent: Lent) -> TaskTableSource:
    return TaskTableSource(lent.orchestrator_task, lent.has_orchestrator_tasks)


def _mcp_tasks(settings: Settings, lent: Lent) -> TaskSource:
    # Imported here: the MCP SDK brings an HTTP server stack along (half a second and some
    # 500 modules), which only an engine that uses this source should load.
    from workflow_engine.capabilities.tasks import McpTaskSource

    return McpTaskSource(settings.mcp)


def _worker_nodes(settings: Settings, lent: Lent) -> Worker:
    timeout = settings.job.timeout_seconds
    if settings.nodes.effective_source == "orchestrator":
        # Read when the worker opens (the table missing stops the start), then refreshed.
        table = NodeTable(
            lent.orchestrator_nodes, allow_plaintext_remote=settings.nodes.allow_plaintext_remote
        )
        return HttpWorker(
            (),
            settings.nodes,
            default_timeout_seconds=timeout,
            refresh=table.load,
            source=table.where,
        )
    # Tokens named by `token_env` are read here, once at start-up, like the settings: the
    # nodes file says which variables, so they cannot be fields of `Settings`.
    nodes = load_nodes_file(
        Path(settings.nodes.file),
        os.environ,
        allow_plaintext_remote=settings.nodes.allow_plaintext_remote,
    )
    lent.context.secrets.add_credentials(node.token for node in nodes)  # never shown
    return HttpWorker(nodes, settings.nodes, default_timeout_seconds=timeout)


TASK_SOURCES: Mapping[str, Builder[TaskSource]] = {
    "inline": lambda s, lent: InlineTaskSource(_task_table(lent)),
    "orchestrator": lambda s, lent: _task_table(lent),
    "mcp": _mcp_tasks,
}


def _model(settings: Settings, lent: Lent) -> ModelClient:
    # One client per engine, shared by the planner and the verifier; `opened` opens it.
    if lent.model is None:
        raise CapabilityConfigError("the model client was not built")  # pragma: no cover
    return lent.model


def _llm_planner(settings: Settings, lent: Lent) -> Planner:
    worker = lent.worker
    if worker is None:
        raise CapabilityConfigError("the worker was not built")  # pragma: no cover

    def workers() -> str:
        # The labels of the nodes known at this plan: from the nodes file, or the orchestrator's
        # nodes table as last refreshed.
        if isinstance(worker, HttpWorker):
            nodes = worker.registry.nodes
            return describe_workers("nodes", sorted({label for n in nodes for label in n.labels}))
        return describe_workers(settings.worker, [])

    return LlmPlanner(
        _model(settings, lent),
        settings.llm,
        load_policy(settings.command_policy_file),
        workers,
        worker.unfit,
    )


def _job_verifier(settings: Settings, lent: Lent) -> Verifier:
    if lent.worker is None or lent.jobs is None:
        raise CapabilityConfigError("the worker was not built")  # pragma: no cover
    return JobVerifier(
        lent.worker,
        lent.jobs,
        shlex.split(settings.verifier_command),
        timeout_seconds=min(settings.job.timeout_seconds, 600),
        excerpt_chars=settings.llm.excerpt_chars,
        secrets=lent.context.secrets,
    )


PLANNERS: Mapping[str, Builder[Planner]] = {
    "static": lambda s, lent: StaticPlanner(),
    "llm": _llm_planner,
}
WORKERS: Mapping[str, Builder[Worker]] = {
    "sandbox": lambda s, lent: LocalSandboxWorker(
        jobs_dir=s.jobs_dir,
        default_timeout_seconds=s.job.timeout_seconds,
        max_output_bytes=s.job.output_bytes,
        confinement=Confinement(
            s.job.limits,
            uid_base=s.job.uid_base,
            uid_count=s.job.uid_count,
            writable_paths=s.job.writable(),
        ),
        retention_seconds=s.job.retention_seconds,
    ),
    "nodes": _worker_nodes,
    "simulated": lambda s, lent: SimulatedWorker(),
}
VERIFIERS: Mapping[str, Builder[Verifier]] = {
    "checks": lambda s, lent: MachineVerifier(secrets=lent.context.secrets),
    "llm": lambda s, lent: LlmVerifier(_model(s, lent), s.llm),
    "job": _job_verifier,
}


_REGISTRIES: Mapping[str, Mapping[str, Builder[Any]]] = {
    "task_source": TASK_SOURCES,
    "planner": PLANNERS,
    "worker": WORKERS,
    "verifier": VERIFIERS,
}


def check_choices(settings: Settings) -> None:
    """Raise `UnknownCapability` naming the first setting that names no implementation, and
    `CapabilityConfigError` when the local sandbox is chosen and its ``jobwrap`` is not built.

    Cheap (no more than a look at one file), so the engine can refuse a bad configuration
    before it starts anything.
    """
    for setting, registry in _REGISTRIES.items():
        name = getattr(settings, setting)
        if name not in registry:
            raise UnknownCapability(
                f"{ENV_PREFIX}{setting.upper()}: unknown {setting.replace('_', ' ')} {name!r}; "
                f"expected one of {', '.join(sorted(registry))}"
            )
    if settings.worker == "sandbox":
        try:
            require_jobwrap()
        except CapabilityConfigError as exc:
            raise CapabilityConfigError(
                f"{ENV_PREFIX}WORKER=sandbox (the default): {exc}; or run jobs on worker nodes "
                f"({ENV_PREFIX}WORKER=nodes)"
            ) from None


def _build(registry: Mapping[str, Builder[T]], setting: str, settings: Settings, lent: Lent) -> T:
    return registry[getattr(settings, setting)](settings, lent)


def build_capabilities(settings: Settings, lent: Lent) -> Capabilities:
    """The capabilities `settings` name; raises `UnknownCapability` naming the setting."""
    check_choices(settings)
    uses_model = "llm" in (settings.planner, settings.verifier)
    if uses_model and lent.model is None:
        lent = replace(lent, model=ModelClient(settings.llm, context=lent.context))
    worker = _build(WORKERS, "worker", settings, lent)
    jobs = JobTracker(
        worker,
        max_running=settings.max_running_jobs,
        max_running_per_tenant=settings.max_running_jobs_per_tenant,
        metrics=lent.context.metrics,
    )
    lent = replace(lent, worker=worker, jobs=jobs)
    return Capabilities(
        task_source=_build(TASK_SOURCES, "task_source", settings, lent),
        planner=_build(PLANNERS, "planner", settings, lent),
        worker=worker,
        verifier=_build(VERIFIERS, "verifier", settings, lent),
        stored_tasks=StoredTasks(lent.stored_task),
        context_budget_chars=settings.context_budget_chars,
        model=lent.model,
        revise_steps=settings.planner == "llm" and settings.llm.revise,
        model_summary=uses_model and settings.llm.summary,
        jobs=jobs,
        context=lent.context,
    )


@asynccontextmanager
async def opened(capabilities: Capabilities) -> AsyncIterator[Capabilities]:
    """Enter every capability that is an async context manager; exit them in reverse order."""
    async with AsyncExitStack() as stack:
        for field in fields(capabilities):
            value: Any = getattr(capabilities, field.name)
            if isinstance(value, AbstractAsyncContextManager):
                await stack.enter_async_context(value)
        yield capabilities
