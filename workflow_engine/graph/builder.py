"""Wires the nodes into the LangGraph state machine.

    load_task_context -> plan_steps -> dispatch_step -> collect_result -> verify_step_result
        -> (dispatch_step: next step or retry | finalize_summary | mark_failed)

Every node is wrapped so that the run driving it can stop it at a node boundary (cancel, lost
lease, shutdown) and learns which node just completed, which the checkpointer writes as
`last_node_id`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph

from workflow_engine.graph import routing
from workflow_engine.graph.nodes import Capabilities, Nodes, node_functions
from workflow_engine.graph.state import WorkflowState
from workflow_engine.storage.checkpointer import RUN_CONTEXT_KEY

log = structlog.get_logger(__name__)

NodeFn = Callable[[WorkflowState], Awaitable[WorkflowState]]


class WrappedNode(Protocol):
    def __call__(
        self, state: WorkflowState, config: RunnableConfig
    ) -> Awaitable[WorkflowState]: ...


class NodeHooks(Protocol):
    """What a run is told around each node (see `workflow_engine.runtime.run`)."""

    def node_started(self, node: str) -> None:
        """Raise to keep the node from starting (the run must stop)."""
        ...

    def node_finished(self, node: str) -> None: ...


def _wrap(name: str, fn: NodeFn) -> WrappedNode:
    async def node(state: WorkflowState, config: RunnableConfig) -> WorkflowState:
        hooks: NodeHooks | None = config.get("configurable", {}).get(RUN_CONTEXT_KEY)
        if hooks is not None:
            hooks.node_started(name)
        started = time.perf_counter()
        with structlog.contextvars.bound_contextvars(node=name):
            update = await fn(state)
            log.debug("node_completed", seconds=round(time.perf_counter() - started, 4))
        if hooks is not None:
            hooks.node_finished(name)
        return update

    node.__name__ = name
    return node


def _async(route: Callable[[WorkflowState], str]) -> Callable[[WorkflowState], Awaitable[str]]:
    """The same router as a coroutine: LangGraph runs plain functions in a thread pool, which
    costs a thread hop per routing decision for what is a dictionary lookup."""

    async def routed(state: WorkflowState) -> str:
        return route(state)

    routed.__name__ = route.__name__
    return routed


def build_graph(
    capabilities: Capabilities,
    checkpointer: BaseCheckpointSaver[Any] | None,
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """Compile the workflow graph over `checkpointer` (None: no persistence, for tests)."""
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(WorkflowState)
    for name, fn in node_functions(Nodes(capabilities)).items():
        builder.add_node(name, _wrap(name, fn))
    builder.add_edge(START, "load_task_context")
    builder.add_edge("load_task_context", "plan_steps")
    builder.add_conditional_edges(
        "plan_steps",
        _async(routing.after_plan),
        ["dispatch_step", "finalize_summary", "mark_failed"],
    )
    builder.add_edge("dispatch_step", "collect_result")
    builder.add_edge("collect_result", "verify_step_result")
    builder.add_conditional_edges(
        "verify_step_result",
        _async(routing.after_verify),
        ["dispatch_step", "finalize_summary", "mark_failed"],
    )
    builder.add_edge("finalize_summary", END)
    builder.add_edge("mark_failed", END)
    return builder.compile(checkpointer=checkpointer)
