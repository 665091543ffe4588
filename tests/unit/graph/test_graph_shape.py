"""The graph the runs step through is the compiled LangGraph graph, and its checkpoints are
LangGraph checkpoints: LangGraph's state snapshot names the node the row names next.

That snapshot does not read `updated_channels`, which LangGraph's loop does when it resumes: a
row could pass here and still not be resumed (it once did). That the loop resumes rows and
finishes them as the engine does is held by `tests/integration/graph/test_langgraph_resumes.py`.
"""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START

from tests.unit.capabilities.test_factory import LENT_NOTHING
from workflow_engine.capabilities import build_capabilities
from workflow_engine.config import Settings
from workflow_engine.graph._builder import EDGES, FIRST, WorkflowGraph, build_graph
from workflow_engine.graph.state import initial_state
from workflow_engine.storage import Checkpoint


@pytest.fixture
def graph() -> WorkflowGraph:
    return build_graph(build_capabilities(Settings(worker="simulated"), LENT_NOTHING))


def test_the_runs_edges_are_the_compiled_graphs(graph: WorkflowGraph) -> None:
    drawn = {(e.source, e.target) for e in graph.compiled.get_graph().edges}
    table = {(START, FIRST)} | {
        (node, target)
        for node, edge in EDGES.items()
        for target in ([edge] if isinstance(edge, str) else edge[1])
    }
    assert drawn == table
    assert set(graph.nodes) == set(graph.compiled.nodes) - {START}


def test_a_plan_of_two_steps_routes_through_every_node_of_a_step(graph: WorkflowGraph) -> None:
    planned: Any = {
        **initial_state("t", "r"),
        "plan": {"steps": [{"id": "a"}, {"id": "b"}]},
        "steps": {"a": {"status": "pending", "attempts": 0}},
    }
    assert graph.next_node("plan_steps", planned) == "dispatch_step"
    assert graph.next_node("collect_result", planned) == "verify_step_result"
    assert graph.next_node("finalize_summary", planned) is None


# Where a workflow goes, node by node: the last node wrote the checkpoint, the next one is what
# LangGraph must see as next. A node that runs again (dispatch after verify) is the case that
# needs LangGraph's version rules right.
PATH = [
    ("load_task_context", "plan_steps"),
    ("plan_steps", "dispatch_step"),
    ("dispatch_step", "collect_result"),
    ("collect_result", "verify_step_result"),
    ("verify_step_result", "dispatch_step"),
    ("dispatch_step", "collect_result"),
    ("collect_result", "verify_step_result"),
    ("verify_step_result", "finalize_summary"),
    ("finalize_summary", None),
]


async def test_langgraph_resumes_each_checkpoint_at_the_node_the_row_names(
    graph: WorkflowGraph,
) -> None:
    saver = InMemorySaver()
    langgraph = graph.compiled.builder.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    checkpoint = Checkpoint.fresh(initial_state("t", "r"), FIRST)
    for step, (node, next_node) in enumerate(PATH, start=1):
        state = {**checkpoint.state, "summary": f"after {node}"}
        checkpoint = checkpoint.after(node, state, ["summary"], next_node)
        stored = checkpoint.stored()
        as_langgraph: Any = {
            **stored,
            "channel_values": {**stored["channel_values"], **checkpoint.state},
        }
        metadata: Any = {"source": "loop", "step": step, "parents": {}}
        await saver.aput(config, as_langgraph, metadata, as_langgraph["channel_versions"])
        snapshot = await langgraph.aget_state(config)
        assert snapshot.next == ((next_node,) if next_node else ()), f"after {node}"
        assert snapshot.values["summary"] == f"after {node}"
    assert END not in checkpoint.stored()["channel_values"]
