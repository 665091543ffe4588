"""A row the engine wrote is a LangGraph checkpoint: LangGraph's own Pregel loop resumes it.

The engine steps its graph itself (`runtime._run`) but keeps each row in LangGraph's checkpoint
layout, so that LangGraph itself could resume it (`storage._langgraph_saver`). This holds that
claim with real parts, for the LangGraph that `constraints.txt` pins: a real PostgreSQL, the
engine running real jobs and writing real rows through its own loop, stopped at a point; then
the row resumed by LangGraph's loop (the compiled graph with `RowSaver` over the row,
``astream(None, ...)``), and a twin workflow stopped at the same point resumed by the engine.
Both must end alike: same status, same results, same node events, every job run exactly once
per attempt, nothing that had completed before the stop run again.

When a LangGraph upgrade moves what the row holds (the checkpoint's keys, its version rules,
how the loop picks the next node), this fails naming the version; docs/architecture.md ("What
LangGraph is for") says what to do then.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import new_task_id, open_to_jobs, shell_step, task
from tests.unit.capabilities.test_factory import LENT_NOTHING
from workflow_engine._context import EngineContext
from workflow_engine.api._requests import task_from_proto
from workflow_engine.capabilities import build_capabilities
from workflow_engine.config import Settings
from workflow_engine.domain.records import Fence, WorkflowRecord
from workflow_engine.engine import Engine
from workflow_engine.graph import formats
from workflow_engine.graph._builder import NODE_EVENT, build_graph
from workflow_engine.graph.changes import CONTINUE_FROM, Decision, decide
from workflow_engine.graph.state import STATE_KEYS
from workflow_engine.storage import queries, tasks
from workflow_engine.storage._checkpointer import RowCheckpointer
from workflow_engine.storage._langgraph_saver import RowSaver
from workflow_engine.storage._workflow_claims import claim_for_resume
from workflow_engine.v1 import workflow_engine_pb2 as pb

CONSTRAINTS = Path(__file__).resolve().parents[3] / "constraints.txt"
INSTALLED = importlib.metadata.version("langgraph")
#: Named in every failure: the LangGraph whose layout and loop failed here (docs/architecture.md,
#: "What LangGraph is for", says what to do).
LANGGRAPH = f"LangGraph {INSTALLED}"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def pinned(package: str) -> str:
    """The version of `package` that constraints.txt pins."""
    found = re.search(rf"^{re.escape(package)}==(\S+)$", CONSTRAINTS.read_text(), re.M)
    assert found, f"constraints.txt pins no {package}"
    return found.group(1)


def test_the_langgraph_exercised_is_the_pinned_one() -> None:
    for package in ("langgraph", "langgraph-checkpoint"):
        installed = importlib.metadata.version(package)
        assert installed == pinned(package), (
            f"{package} {installed} is installed, constraints.txt pins {pinned(package)}: "
            "these tests hold the row's layout for the pinned one only"
        )


def spec(marks: Path) -> pb.TaskSpec:
    """Three steps, each leaving a line in `marks` per run; `two` fails its first attempt and
    is retried."""
    open_to_jobs(marks)
    return task(
        shell_step("one", f"echo run >> {marks}/one; echo one"),
        shell_step(
            "two", f'echo run >> {marks}/two; test "$WORKFLOW_ENGINE_ATTEMPT" -ge 2 && echo two'
        ),
        shell_step("three", f"echo run >> {marks}/three; echo three"),
    )


def gated_spec(marks: Path) -> pb.TaskSpec:
    """Three steps, each leaving a line in `marks` per run; `two` waits for approval."""
    open_to_jobs(marks)
    return task(
        shell_step("one", f"echo run >> {marks}/one; echo one"),
        shell_step("two", f"echo run >> {marks}/two; echo two", requires_approval=True),
        shell_step("three", f"echo run >> {marks}/three; echo three"),
    )


#: Where the engine is stopped: right after the n-th checkpoint a node wrote.
STOPS = {
    "planned, before any job": ("plan_steps", 1),
    "a result collected, not verified": ("collect_result", 1),
    "between two steps": ("verify_step_result", 1),
    "mid-retry: a step failed, to run again": ("verify_step_result", 2),
}
#: A workflow that stops by itself: it waits for approval of step `two`.
WAITING = "waiting for approval"
#: The node that runs next from each row, which LangGraph must run first.
NEXT = {
    "planned, before any job": "dispatch_step",
    "a result collected, not verified": "verify_step_result",
    "between two steps": "dispatch_step",
    "mid-retry: a step failed, to run again": "dispatch_step",
    WAITING: "dispatch_step",  # the decision routes it there, as `CONTINUE_FROM` would
}


def spec_for(where: str, marks: Path) -> pb.TaskSpec:
    return gated_spec(marks) if where == WAITING else spec(marks)


@dataclass
class StopAfter:
    """Stands in for the engine's fault plan (`_faults.FaultPlan.at`, called right after each
    checkpoint commits): asks the run of `task_id` to stop once `node` has written its `nth`
    checkpoint, so it stops at the next node boundary with that row in place."""

    engine: Engine
    node: str
    nth: int
    task_id: str = ""
    seen: int = 0

    def at(self, point: str, node: str) -> None:
        if point == "after" and node == self.node:
            self.seen += 1
            if self.seen == self.nth:
                run = self.engine.runs.get(self.task_id)
                assert run is not None
                run.request_stop("stopped here by the test")


@pytest.fixture
async def engine(settings: Settings) -> AsyncIterator[Engine]:
    """An engine that adopts nothing on its own: a stopped workflow waits for the test."""
    async with Engine(settings.with_overrides(recovery_enabled=False)) as engine:
        yield engine


async def stopped(engine: Engine, task: pb.TaskSpec, task_id: str) -> WorkflowRecord:
    """The row of a workflow the engine ran until it stopped (its lease released)."""
    await engine.start(task_from_proto(task), task_id=task_id)
    assert await engine.runs.wait(task_id, 30)
    return await queries.get(engine.pool, task_id)


async def resume_with_langgraph(
    engine: Engine, task_id: str, decision: Decision | None = None
) -> list[str]:
    """Resume the row with LangGraph's loop, under a lease of its own, `decision` applied
    first as the engine applies it (`graph.changes`: an update as `CONTINUE_FROM`, which is
    LangGraph's ``update_state(as_node=...)``); the nodes the loop ran."""
    claim = await claim_for_resume(
        engine.pool, task_id=task_id, holder_id="langgraph", process="", ttl_seconds=60
    )
    assert claim.lease is not None
    fence = Fence(task_id, claim.record.run_id, "langgraph", claim.lease.epoch)
    # Capabilities of its own (no run manager admits its jobs), reading the stored task.
    lent = replace(
        LENT_NOTHING, stored_task=partial(tasks.load, engine.pool), context=EngineContext()
    )
    graph = build_graph(build_capabilities(engine.settings, lent))
    checkpoints = RowCheckpointer(
        engine.pool, state_keys=STATE_KEYS, upgrade=formats.upgrade, context=lent.context
    )
    saver = RowSaver(checkpoints, fence, nodes=graph.nodes, event_key=NODE_EVENT)
    langgraph = graph.compiled.builder.compile(checkpointer=saver)
    ran: list[str] = []
    try:
        if decision is not None:
            state: Any = claim.record.state
            update = decide(state, decision, engine.context.clock.now())
            event = {"node": update.label, "kind": update.kind, "detail": update.detail}
            values = {**update.values, NODE_EVENT: {**event, "actor": update.actor}}
            await langgraph.aupdate_state(saver.config(), values, as_node=CONTINUE_FROM)
        async for step in langgraph.astream(
            None, saver.config(), stream_mode="updates", durability="sync"
        ):
            ran.extend(step)
        # What LangGraph wrote last is a row the engine reads, which names no next node.
        last = await checkpoints.read(task_id, graph.nodes)
        assert last is not None and last.next_node is None, LANGGRAPH
    finally:
        await checkpoints.close()
    return ran


async def resume_with_engine(
    engine: Engine, task_id: str, decision: Decision | None = None
) -> None:
    await engine.service.resume(task_id=task_id, holder_id="", decision=decision)
    assert await engine.runs.wait(task_id, 30)


async def outcome(engine: Engine, task_id: str, marks: Path) -> dict[str, Any]:
    """What must not differ between the two loops (ids and times naturally do)."""
    record = await queries.get(engine.pool, task_id)
    state = record.state
    events = await queries.events(engine.pool, task_id, 1)
    return {
        "status": record.status,
        "state's keys": sorted(state),
        "last_node_id": record.last_node_id,
        "error": record.error,
        "summary": UUID.sub("<id>", record.summary),  # names the jobs, whose ids are the task's
        "results": [
            (r["step_id"], r["attempt"], r["exit_code"], r["stdout"]) for r in state["results"]
        ],
        "steps": {sid: (s["status"], s["attempts"]) for sid, s in state["steps"].items()},
        "verification": state["verification"],
        "current_step_index": state["current_step_index"],
        "events": [(e.kind, e.node_id, e.detail) for e in events],
        "runs of each step": {f.name: f.read_text().count("run") for f in marks.iterdir()},
    }


async def check_same_end(
    engine: Engine,
    where: str,
    tmp_path: Path,
    stop: StopAfter | None = None,
    decision: Decision | None = None,
) -> dict[str, Any]:
    """Two twin workflows stopped where `stop` stops them (or where they pause by themselves),
    one resumed by LangGraph's loop and one by the engine's, end alike; the engine's outcome.

    LangGraph must start at the node the row names next and rerun nothing before it: the
    events before the stop stay as they were, and each event after it is a node LangGraph ran.
    """
    task_ids = {"langgraph": new_task_id(), "engine": new_task_id()}
    rows = {}
    for loop, task_id in task_ids.items():
        if stop is not None:
            stop.task_id, stop.seen = task_id, 0
        rows[loop] = await stopped(engine, spec_for(where, tmp_path / loop), task_id)
    stopped_as = {loop: (row.status, row.last_node_id) for loop, row in rows.items()}
    paused = ("WAITING_FOR_APPROVAL", "dispatch_step")
    assert (
        stopped_as["langgraph"]
        == stopped_as["engine"]
        == (("RUNNING", stop.node) if stop is not None else paused)
    )
    before = await outcome(engine, task_ids["langgraph"], tmp_path / "langgraph")

    ran = await resume_with_langgraph(engine, task_ids["langgraph"], decision)
    await resume_with_engine(engine, task_ids["engine"], decision)

    langgraph = await outcome(engine, task_ids["langgraph"], tmp_path / "langgraph")
    reference = await outcome(engine, task_ids["engine"], tmp_path / "engine")
    assert ran[:1] == [NEXT[where]], f"{LANGGRAPH} resumed {where!r} at {ran}, not {NEXT[where]}"
    assert langgraph["events"][: len(before["events"])] == before["events"], LANGGRAPH
    after = langgraph["events"][len(before["events"]) :]
    assert [e[1] for e in after if e[0] == "node"] == ran, LANGGRAPH
    dropped = sorted(set(reference["state's keys"]) - set(langgraph["state's keys"]))
    assert dropped == [], f"{LANGGRAPH} left {dropped} out of the rows it wrote for {where!r}"
    differences = {k: (langgraph[k], v) for k, v in reference.items() if langgraph[k] != v}
    assert differences == {}, (
        f"{LANGGRAPH} finished {where!r} otherwise than the engine, in {sorted(differences)}: "
        + "; ".join(f"{k}: LangGraph {a!r}, engine {b!r}" for k, (a, b) in differences.items())
    )
    assert reference["status"] == "SUCCEEDED"
    return reference


@pytest.mark.parametrize("where", list(STOPS))
async def test_langgraphs_loop_finishes_a_stopped_row_as_the_engine_does(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    node, nth = STOPS[where]
    stop = StopAfter(engine, node, nth)
    monkeypatch.setattr(engine.context.faults, "at", stop.at)
    reference = await check_same_end(engine, where, tmp_path, stop=stop)
    assert reference["runs of each step"] == {"one": 1, "two": 2, "three": 1}


async def test_langgraphs_loop_finishes_a_row_waiting_for_approval_as_the_engine_does(
    engine: Engine, tmp_path: Path
) -> None:
    approve = Decision("two", "approve", decided_by="alice")
    reference = await check_same_end(engine, WAITING, tmp_path, decision=approve)
    assert reference["runs of each step"] == {"one": 1, "two": 1, "three": 1}
