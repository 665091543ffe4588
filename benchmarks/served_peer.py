"""The served peer: what a user would write instead of this engine, behind the same contract.

LangGraph + `AsyncPostgresSaver` (durability "sync") behind a `grpc.aio` server that
implements `StartWorkflow`, `GetWorkflow` and `WatchWorkflow` of the project's `.proto`, over
the same node names and routing as the engine's graph:

- after every node, the contract upsert of the task's `workflow_checkpoints` row, whole state;
- in `collect_result`, the step's command run as an asyncio subprocess, its exit code kept;
- events (each node's NODE_COMPLETED, STATUS_CHANGED at the start and the end) pushed to
  watchers from memory, with `kinds` filtering as the engine's contract says.

No lease, no fencing, no recovery, no idempotency beyond "this task id already started": the
peer is what the engine is measured against, so it is kept as small as a user would keep it.
`compare.py` runs it as a process of its own (as `serve` is), on a fresh database per point:

    .venv/bin/python benchmarks/served_peer.py --database-url URL --listen 127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypedDict

import grpc

# The contract row every contender keeps current, as the bare LangGraph contenders write it (the
# peer runs as a script from this directory, so its sibling module is importable).
from contenders import CONTRACT_TABLE, UPSERT
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

ENDED = {pb.SUCCEEDED, pb.FAILED, pb.CANCELLED}


class PeerState(TypedDict, total=False):
    task_id: str
    commands: list[list[str]]
    current_step_index: int
    attempts_by_step: dict[str, int]
    results: list[dict[str, Any]]
    status: str


@dataclass
class Run:
    """One workflow as the peer holds it in memory: its events, and who waits for more."""

    task_id: str
    run_id: str
    status: int = pb.RUNNING
    last_node_id: str = ""
    events: list[pb.WorkflowEvent] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, kind: int, node: str = "") -> None:
        now = Timestamp()
        now.GetCurrentTime()
        self.events.append(
            pb.WorkflowEvent(
                task_id=self.task_id,
                sequence=len(self.events) + 1,
                kind=kind,  # type: ignore[arg-type]
                node_id=node,
                status=self.status,  # type: ignore[arg-type]
                time=now,
                run_id=self.run_id,
            )
        )
        self.changed.set()
        self.changed = asyncio.Event()


def graph(
    pool: AsyncConnectionPool[Any], on_node: Callable[[str, str], None]
) -> StateGraph[Any, Any, Any, Any]:
    """The engine's node names and routing, each node followed by the contract upsert."""

    def node(name: str, update: Callable[[PeerState], Any]) -> Callable[..., Awaitable[Any]]:
        async def run(state: PeerState) -> PeerState:
            changes = update(state)
            if inspect.isawaitable(changes):
                changes = await changes
            async with pool.connection() as conn:
                await conn.execute(
                    UPSERT,
                    {
                        "task_id": state["task_id"],
                        "state": Jsonb({**state, **changes}),
                        "node": name,
                    },
                )
            on_node(state["task_id"], name)
            return changes  # type: ignore[no-any-return]

        return run

    def dispatch(state: PeerState) -> PeerState:
        step = f"s{state['current_step_index']}"
        return {"attempts_by_step": {**state.get("attempts_by_step", {}), step: 1}}

    async def collect(state: PeerState) -> PeerState:
        process = await asyncio.create_subprocess_exec(
            *state["commands"][state["current_step_index"]]
        )
        exit_code = await process.wait()
        return {"results": [*state.get("results", []), {"exit_code": exit_code}]}

    def verify(state: PeerState) -> PeerState:
        if state["results"][-1]["exit_code"] != 0:
            return {"status": "failed"}
        return {"current_step_index": state["current_step_index"] + 1}

    def route(state: PeerState) -> str:
        if state.get("status") == "failed":
            return "mark_failed"
        if state["current_step_index"] >= len(state["commands"]):
            return "finalize_summary"
        return "dispatch_step"

    built: StateGraph[Any, Any, Any, Any] = StateGraph(PeerState)
    built.add_node("load_task_context", node("load_task_context", lambda s: {"status": "running"}))
    built.add_node("plan_steps", node("plan_steps", lambda s: {"current_step_index": 0}))
    built.add_node("dispatch_step", node("dispatch_step", dispatch))
    built.add_node("collect_result", node("collect_result", collect))
    built.add_node("verify_step_result", node("verify_step_result", verify))
    built.add_node("finalize_summary", node("finalize_summary", lambda s: {"status": "succeeded"}))
    built.add_node("mark_failed", node("mark_failed", lambda s: {"status": "failed"}))
    built.add_edge(START, "load_task_context")
    built.add_edge("load_task_context", "plan_steps")
    built.add_edge("plan_steps", "dispatch_step")
    built.add_edge("dispatch_step", "collect_result")
    built.add_edge("collect_result", "verify_step_result")
    built.add_conditional_edges(
        "verify_step_result", route, ["dispatch_step", "finalize_summary", "mark_failed"]
    )
    built.add_edge("finalize_summary", END)
    built.add_edge("mark_failed", END)
    return built


class Peer(pb_grpc.WorkflowEngineServicer):
    """StartWorkflow, GetWorkflow and WatchWorkflow over the graph; every other RPC is
    UNIMPLEMENTED (the servicer's default)."""

    def __init__(self, pool: AsyncConnectionPool[Any], saver: AsyncPostgresSaver) -> None:
        self.runs: dict[str, Run] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.graph = graph(pool, self._node_done).compile(checkpointer=saver)

    def _node_done(self, task_id: str, node: str) -> None:
        run = self.runs[task_id]
        run.last_node_id = node
        run.add(pb.NODE_COMPLETED, node)

    async def _run(self, run: Run, commands: list[list[str]]) -> None:
        config = {"configurable": {"thread_id": run.task_id}}
        try:
            final = await self.graph.ainvoke(
                {"task_id": run.task_id, "commands": commands}, config, durability="sync"
            )
            run.status = pb.SUCCEEDED if final.get("status") == "succeeded" else pb.FAILED
        except Exception:  # a run that breaks ends FAILED, as a user would have it
            run.status = pb.FAILED
        run.add(pb.STATUS_CHANGED)

    async def StartWorkflow(
        self, request: pb.StartWorkflowRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.StartWorkflowResponse:
        if not request.task_id or not request.task.steps:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "task_id and task.steps")
        known = self.runs.get(request.task_id)
        if known is not None:
            status = pb.ALREADY_FINISHED if known.status in ENDED else pb.ALREADY_RUNNING
            return pb.StartWorkflowResponse(
                task_id=known.task_id,
                run_id=known.run_id,
                status=status,
                workflow_status=known.status,
            )
        run = Run(request.task_id, str(uuid.uuid4()))
        self.runs[run.task_id] = run
        run.add(pb.STATUS_CHANGED)
        commands = [list(step.command) for step in request.task.steps]
        task = asyncio.create_task(self._run(run, commands))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return pb.StartWorkflowResponse(
            task_id=run.task_id, run_id=run.run_id, status=pb.STARTED, workflow_status=pb.RUNNING
        )

    async def GetWorkflow(
        self, request: pb.GetWorkflowRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.Workflow:
        run = self.runs.get(request.task_id)
        if run is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"task {request.task_id}")
        return pb.Workflow(
            task_id=run.task_id,
            run_id=run.run_id,
            status=run.status,  # type: ignore[arg-type]
            last_node_id=run.last_node_id,
        )

    async def WatchWorkflow(
        self, request: pb.WatchWorkflowRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.WorkflowEvent]:
        run = self.runs.get(request.task_id)
        if run is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"task {request.task_id}")
        kinds = set(request.kinds)
        sent = max(request.from_sequence, 1) - 1
        while True:
            changed = run.changed
            for event in run.events[sent:]:
                sent += 1
                final = event.kind == pb.STATUS_CHANGED and event.status in ENDED
                if not kinds or event.kind in kinds or final:
                    yield event
                if final:
                    return
            await changed.wait()


async def serve(database_url: str, listen: str) -> None:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        database_url,
        min_size=1,
        max_size=22,  # as the engine's pool at concurrency 20 and over
        open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    )
    await pool.open(wait=True)
    async with pool.connection() as conn:
        await conn.execute(CONTRACT_TABLE)
    saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
    await saver.setup()
    server = grpc.aio.server()
    pb_grpc.add_WorkflowEngineServicer_to_server(Peer(pool, saver), server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    server.add_insecure_port(listen)
    await server.start()
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(1)
    await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--listen", required=True, help="host:port")
    args = parser.parse_args()
    asyncio.run(serve(args.database_url, args.listen))


if __name__ == "__main__":
    main()
