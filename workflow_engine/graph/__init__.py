"""The LangGraph state machine: state, nodes, routing and how they are wired.

What the runtime and the service use (`__all__`): `build_graph` and the `WorkflowGraph` it
returns, with the `NodeContext` a node runs in and `jobs_in_flight`; and the modules `state`
(the workflow state), `changes` (what a decision or an override changes), `routing` and
`formats` (the state's formats and their upgrades). `_nodes` (the nodes themselves) and
`_builder` are its own.
"""

from workflow_engine.graph import changes, formats, routing, state
from workflow_engine.graph._builder import (
    FIRST,
    NODE_EVENT,
    NodeContext,
    WorkflowGraph,
    build_graph,
)
from workflow_engine.graph._nodes import jobs_in_flight

__all__ = [
    "FIRST",
    "NODE_EVENT",
    "NodeContext",
    "WorkflowGraph",
    "build_graph",
    "changes",
    "formats",
    "jobs_in_flight",
    "routing",
    "state",
]
