"""The engine steps through its LangGraph graph itself (see `runtime._run`); LangGraph's own loop
runs the same compiled graph to the same end, node for node."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from tests.conftest import RunningEngine
from tests.support.helpers import new_task_id, step, task, wait_for_status
from tests.unit.capabilities.test_factory import LENT_NOTHING
from workflow_engine.capabilities import build_capabilities
from workflow_engine.graph import build_graph
from workflow_engine.graph.state import initial_state
from workflow_engine.storage import queries, tasks
from workflow_engine.v1 import workflow_engine_pb2 as pb


async def test_langgraphs_loop_and_the_engines_run_the_same_nodes_to_the_same_end(
    running: RunningEngine,
) -> None:
    task_id = new_task_id()
    spec = task(step("greet", "echo", "hello"), step("check", "sh", "-c", "test -d /"))
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    assert (await wait_for_status(running.stub, task_id)).status == pb.SUCCEEDED
    engine = running.engine
    ran = [e.node_id for e in await queries.events(engine.pool, task_id, 1) if e.kind == "node"]
    stored = (await queries.get(engine.pool, task_id)).state

    # The same task (stored by the start above), run by LangGraph's Pregel loop over the same
    # graph and capabilities, with no checkpointer and no run to admit its jobs.
    lent = replace(LENT_NOTHING, stored_task=partial(tasks.load, engine.pool))
    graph = build_graph(build_capabilities(engine.settings, lent))
    langgraph_nodes: list[str] = []
    start = initial_state(task_id, stored["run_id"])  # the same run: the same job ids
    final: dict[str, Any] = dict(start)
    async for update in graph.compiled.astream(start, stream_mode="updates"):
        for node, values in update.items():
            langgraph_nodes.append(node)
            final.update({k: v for k, v in values.items() if k != "node_event"})

    assert langgraph_nodes == ran
    assert ran[0] == "load_task_context" and ran[-1] == "finalize_summary"
    assert final["status"] == stored["status"] == "succeeded"
    assert [r["stdout"] for r in final["results"]] == [r["stdout"] for r in stored["results"]]
    assert final["summary"] == stored["summary"]
