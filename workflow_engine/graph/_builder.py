"""Wires the nodes into the LangGraph state machine.

    load_task_context -> plan_steps -> dispatch_step -> collect_result -> verify_step_result
        -> (dispatch_step: next steps, retries, or collect what runs
            | finalize_summary | mark_failed | suspend_workflow: a budget is used up)

`dispatch_step` also ends the graph while a step waits for approval (WAITING_FOR_APPROVAL);
decisions, raised budgets and operator overrides continue it from `verify_step_result`'s
router (see `workflow_engine.graph.changes`).

The graph is one table, `edges(clock)` (where each node leads), compiled into a LangGraph
`StateGraph`. The engine's runs step through the same table themselves (`WorkflowGraph`, see
`runtime._run`): one node at a time, each followed by its fenced checkpoint write, which is what
LangGraph's loop with a checkpointer does, at a fraction of its cost. The compiled graph runs
the same nodes under LangGraph's own loop (`tests/integration/runtime/test_graph_loops.py`
checks that both agree); it has no checkpointer of its own, and given one over a task's row
(`storage._langgraph_saver.RowSaver`) it resumes a row the engine wrote and finishes it as the
engine does (`tests/integration/graph/test_langgraph_resumes.py`).

Every node is wrapped: its body runs through the run's `guard` (LangGraph's runtime context
carries the run's hooks), so the run can stop it at a node boundary or interrupt it (cancel, a
change to apply, a lost lease); and it records what completed and what came of it in the
`node_event` key of its update, which the run writes as `last_node_id` and the node's event.
An exception a node does not handle itself ends the workflow in `mark_failed` with the
exception as its error: never silently.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import structlog
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.runtime import Runtime

from workflow_engine._clock import Clock, SystemClock
from workflow_engine._masking import Secrets, for_workflow, state_secrets
from workflow_engine.capabilities import Capabilities, JobTracker
from workflow_engine.domain.values import JsonObject
from workflow_engine.graph import routing
from workflow_engine.graph._nodes import Nodes, is_control, node_functions
from workflow_engine.graph.state import WorkflowState

log = structlog.get_logger(__name__)

NodeFn = Callable[[WorkflowState], Awaitable[WorkflowState]]


class GraphState(WorkflowState, total=False):
    """The graph's channels: the workflow state, plus what the last node recorded.

    `node_event` is not in `STATE_KEYS`: it becomes the node's event, not part of the state.
    """

    node_event: JsonObject


#: The key of a node's update that records what completed: ``{"node", "kind", "detail"}``
#: (a change applied from outside adds ``"actor"``).
NODE_EVENT: Final = "node_event"


class NodeHooks(Protocol):
    """What a run is told around each node (see `workflow_engine.runtime._run`); passed as
    LangGraph's runtime context."""

    def guard(self, node: str, body: Awaitable[WorkflowState]) -> Awaitable[WorkflowState]:
        """Run the node's body; raise instead when the run must stop (before or during it)."""
        ...


@dataclass(frozen=True, slots=True)
class NodeContext:
    """LangGraph's runtime context for this graph: the hooks of the run driving it."""

    hooks: NodeHooks


class WrappedNode(Protocol):
    def __call__(
        self, state: WorkflowState, *, runtime: Runtime[NodeContext | None]
    ) -> Awaitable[GraphState]: ...


def _wrap(name: str, fn: NodeFn, secrets: Secrets) -> WrappedNode:
    async def node(state: WorkflowState, *, runtime: Runtime[NodeContext | None]) -> GraphState:
        hooks = runtime.context.hooks if runtime.context is not None else None
        started = time.perf_counter()
        with structlog.contextvars.bound_contextvars(node=name):
            try:
                update = await (hooks.guard(name, fn(state)) if hooks else fn(state))
            except Exception as exc:
                if is_control(exc):
                    raise
                log.exception("node_raised")
                shown = for_workflow(secrets, state_secrets(state)).masked_repr(exc)
                update = {"error": f"node {name} raised {shown}", "forced_next": "mark_failed"}
            log.debug("node_completed", seconds=round(time.perf_counter() - started, 4))
        # The workflow's own secrets (its new plan's too) and the engine's credentials: what
        # its callers read is masked with no other workflow's.
        masking = for_workflow(secrets, state_secrets(state) | state_secrets(update))
        kind, detail = describe(name, update, state, masking)
        return {**update, NODE_EVENT: {"node": name, "kind": kind, "detail": detail}}

    node.__name__ = name
    return node


def describe(
    node: str, update: WorkflowState, before: WorkflowState, secrets: Secrets
) -> tuple[str, str]:
    """The event kind and the one-line outcome a node's update is recorded with, followed by
    the steps it revised and the model calls it made, when it did; `secrets` masked."""
    kind, detail = _outcome(node, update, before, secrets)
    revised = update.get("revisions", [])[len(before.get("revisions", [])) :]
    for r in revised:
        change = (
            f"error: {r['error']}"
            if r.get("error")
            else f"{r.get('command_before')} -> {r.get('command_after')}"
        )
        detail += f"; revised {r.get('step_id')} ({change}) because: {r.get('reason', '')}"
    calls = update.get("model_calls", [])[len(before.get("model_calls", [])) :]
    if calls:
        tokens = [(c["prompt_tokens"], c["completion_tokens"]) for c in calls]
        detail += (
            f" [model {calls[-1]['model']}: {len(calls)} call(s), "
            f"{sum(p for p, _ in tokens)} prompt + {sum(c for _, c in tokens)} completion "
            f"tokens, {sum(c['latency_ms'] for c in calls)} ms]"
        )
    return kind, secrets.redact(detail)[:2000]  # masked before it is cut


def _outcome(
    node: str, update: WorkflowState, before: WorkflowState, secrets: Secrets
) -> tuple[str, str]:
    request = update.get("pending_approval")
    if node == "dispatch_step" and request:
        return "approval_requested", str(request.get("reason", ""))
    steps = update.get("steps") or {}
    if node == "dispatch_step":
        sent = [sid for sid, s in steps.items() if s.get("status") == "dispatched"]
        return "node", f"dispatched {', '.join(sent)}" if sent else "nothing to dispatch"
    if node == "collect_result":
        got = [sid for sid, s in steps.items() if s.get("status") == "collected"]
        return "node", f"collected {', '.join(got)}" if got else "nothing collected"
    if node == "verify_step_result":
        judged = {
            sid for sid, s in (before.get("steps") or {}).items() if s.get("status") == "collected"
        }
        verdicts = [f"{sid}: {s['status']}" for sid, s in steps.items() if sid in judged]
        return "node", "; ".join(verdicts)
    if update.get("error"):
        return "node", secrets.redact(str(update["error"]))[:500]
    if node == "plan_steps" and update.get("plan"):
        ids = [str(s.get("id")) for s in update["plan"].get("steps", [])]
        return "node", f"planned {len(ids)} step(s): {', '.join(ids)}"[:500]
    return "node", str(update.get("status") or "")


Router = Callable[[WorkflowState], str]

#: The first node of every workflow.
FIRST = "load_task_context"

Edges = dict[str, str | tuple[Router, list[str]]]


def edges(clock: Clock) -> Edges:
    """Where each node leads: one next node, or a router choosing among the listed ones from
    the state after the node (END: the workflow ends or pauses there). One next node per node,
    never two at once: a run writes one checkpoint per node. The deadline is judged on
    `clock`."""

    def after_verify(state: WorkflowState) -> str:
        return routing.after_verify(state, clock.now())

    after_verify.__name__ = "after_verify"
    return {
        "load_task_context": (routing.after_load, ["plan_steps", "mark_failed"]),
        "plan_steps": (routing.after_plan, ["dispatch_step", "finalize_summary", "mark_failed"]),
        "dispatch_step": (
            routing.after_dispatch,
            ["collect_result", "finalize_summary", "mark_failed", END],
        ),
        "collect_result": "verify_step_result",
        "verify_step_result": (
            after_verify,
            ["plan_steps", "dispatch_step", "finalize_summary", "mark_failed", "suspend_workflow"],
        ),
        "finalize_summary": END,
        "mark_failed": END,
        "suspend_workflow": END,
    }


#: The table on the real clock (its shape is the same on any clock).
EDGES: Edges = edges(SystemClock())


@dataclass(frozen=True, slots=True)
class WorkflowGraph:
    """The workflow's nodes and edges: the compiled LangGraph graph, and the same wrapped nodes
    and `EDGES` for a run to step through itself."""

    compiled: CompiledStateGraph[Any, Any, Any, Any]
    nodes: Mapping[str, WrappedNode]
    edges: Edges = field(default_factory=lambda: EDGES)

    def next_node(self, node: str, state: WorkflowState) -> str | None:
        """Where the graph goes after `node` left `state`; None: it ends there."""
        edge = self.edges[node]
        target = edge if isinstance(edge, str) else edge[0](state)
        return None if target == END else target


def _async(route: Router) -> Callable[[WorkflowState], Awaitable[str]]:
    """The same router as a coroutine: LangGraph runs plain functions in a thread pool, which
    costs a thread hop per routing decision for what is a dictionary lookup."""

    async def routed(state: WorkflowState) -> str:
        return route(state)

    routed.__name__ = route.__name__
    return routed


def build_graph(capabilities: Capabilities, *, jobs: JobTracker | None = None) -> WorkflowGraph:
    """The workflow graph over `capabilities`.

    `jobs` runs the dispatched jobs; pass it to let the run manager forget a stopped run's jobs.
    """
    secrets = capabilities.context.secrets
    functions = node_functions(Nodes(capabilities, jobs))
    nodes = {name: _wrap(name, fn, secrets) for name, fn in functions.items()}
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(GraphState)
    for name, node in nodes.items():
        builder.add_node(name, node)
    builder.add_edge(START, FIRST)
    table = edges(capabilities.context.clock)
    for name, edge in table.items():
        if isinstance(edge, str):
            builder.add_edge(name, edge)
        else:
            builder.add_conditional_edges(name, _async(edge[0]), edge[1])
    return WorkflowGraph(builder.compile(), nodes, table)
