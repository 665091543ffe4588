"""The LangGraph state machine: state, nodes, routing and how they are wired.

What the runtime and the service use (`__all__`): `build_graph` and the `WorkflowGraph` it
returns, with the `NodeContext` a node runs in; and the modules `state` (the workflow state),
`changes` (what a decision or an override changes) and `routing`. `nodes` (the nodes
themselves) is internal.
"""

from workflow_engine.graph import changes, routing, state
from workflow_engine.graph._builder import NodeContext, WorkflowGraph, build_graph

__all__ = ["NodeContext", "WorkflowGraph", "build_graph", "changes", "routing", "state"]
