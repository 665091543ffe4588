"""The contenders of `make bench`, each running the same 12-node workflow shape.

Shape: load, plan, then dispatch/collect/verify for each of 3 steps, finalize. Work in each
node is trivial, so what is measured is the cost of durability itself. Every contender exposes
`async run(workflow_index) -> None` (one whole workflow) and `async close()`.
"""

from __future__ import annotations

import asyncio
import inspect
import shutil
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any, TypedDict

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc
from langgraph.graph import END, START, StateGraph
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from workflow_engine import Engine, Settings, Step, TaskSpec
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

STEPS = 3
NODES = 3 + 3 * STEPS  # load, plan, finalize + dispatch/collect/verify per step
ENGINE_TASK = pb.TaskSpec(steps=[pb.Step(id=f"s{i}", command=["true"]) for i in range(STEPS)])


def engine_task() -> TaskSpec:
    """`ENGINE_TASK` for the in-process API (built per workflow, as a caller's would be)."""
    return TaskSpec(steps=tuple(Step(id=f"s{i}", command=("true",)) for i in range(STEPS)))


# The contract row every contender must keep current after each node.
CONTRACT_TABLE = """
CREATE TABLE IF NOT EXISTS workflow_checkpoints (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(), task_id uuid NOT NULL UNIQUE,
    state jsonb NOT NULL, last_node_id text, updated_at timestamptz NOT NULL DEFAULT now()
)
"""
UPSERT = """
INSERT INTO workflow_checkpoints (task_id, state, last_node_id, updated_at)
VALUES (%(task_id)s, %(state)s, %(node)s, now())
ON CONFLICT (task_id) DO UPDATE
   SET state = EXCLUDED.state, last_node_id = EXCLUDED.last_node_id, updated_at = now()
"""

#: The repository, for the test helpers a contender reuses.
REPOSITORY = str(Path(__file__).resolve().parent.parent)


class BareState(TypedDict, total=False):
    task_id: str
    current_step_index: int
    attempts_by_step: dict[str, int]
    last_result: dict[str, Any]
    status: str


def bare_graph(
    upsert_pool: AsyncConnectionPool[Any] | None, command: tuple[str, ...] = ()
) -> StateGraph[Any, Any, Any, Any]:
    """The same node names and routing as the engine's graph, with trivial node bodies.

    With a `command`, `collect_result` runs it as an asyncio subprocess (what a LangGraph
    application that runs real commands would write) and records its exit code.
    """

    def node(name: str, update: Any) -> Any:
        async def run(state: BareState) -> BareState:
            changes = update(state)
            if inspect.isawaitable(changes):
                changes = await changes
            if upsert_pool is not None:
                async with upsert_pool.connection() as conn:
                    await conn.execute(
                        UPSERT,
                        {
                            "task_id": state["task_id"],
                            "state": Jsonb({**state, **changes}),
                            "node": name,
                        },
                    )
            return changes

        return run

    def verify(state: BareState) -> BareState:
        return {"current_step_index": state.get("current_step_index", 0) + 1}

    def dispatch(state: BareState) -> BareState:
        step = f"s{state.get('current_step_index', 0)}"
        return {"attempts_by_step": {**state.get("attempts_by_step", {}), step: 1}}

    async def run_command(state: BareState) -> BareState:
        process = await asyncio.create_subprocess_exec(*command)
        return {"last_result": {"exit_code": await process.wait()}}

    def collect(state: BareState) -> Any:
        return run_command(state) if command else {"last_result": {"exit_code": 0}}

    graph: StateGraph[Any, Any, Any, Any] = StateGraph(BareState)
    graph.add_node("load_task_context", node("load_task_context", lambda s: {"status": "running"}))
    graph.add_node("plan_steps", node("plan_steps", lambda s: {"current_step_index": 0}))
    graph.add_node("dispatch_step", node("dispatch_step", dispatch))
    graph.add_node("collect_result", node("collect_result", collect))
    graph.add_node("verify_step_result", node("verify_step_result", verify))
    graph.add_node("finalize_summary", node("finalize_summary", lambda s: {"status": "succeeded"}))
    graph.add_edge(START, "load_task_context")
    graph.add_edge("load_task_context", "plan_steps")
    graph.add_edge("plan_steps", "dispatch_step")
    graph.add_edge("dispatch_step", "collect_result")
    graph.add_edge("collect_result", "verify_step_result")
    graph.add_conditional_edges(
        "verify_step_result",
        lambda s: "finalize_summary" if s["current_step_index"] >= STEPS else "dispatch_step",
        ["dispatch_step", "finalize_summary"],
    )
    graph.add_edge("finalize_summary", END)
    return graph


class LangGraphPostgres:
    """Contender 1: LangGraph + AsyncPostgresSaver (durability sync) + the contract upsert."""

    name = "langgraph+AsyncPostgresSaver"
    command: tuple[str, ...] = ()

    async def open(self, url: str, concurrency: int) -> None:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from psycopg.rows import dict_row

        self.pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=min(concurrency, 20) + 1,
            open=False,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        )
        await self.pool.open(wait=True)
        async with self.pool.connection() as conn:
            await conn.execute(CONTRACT_TABLE)
        self.saver = AsyncPostgresSaver(self.pool)  # type: ignore[arg-type]
        await self.saver.setup()
        self.graph = bare_graph(self.pool, self.command).compile(checkpointer=self.saver)

    async def run(self, i: int) -> None:
        task_id = str(uuid.uuid4())
        await self.graph.ainvoke(
            {"task_id": task_id}, {"configurable": {"thread_id": task_id}}, durability="sync"
        )

    async def close(self) -> None:
        await self.pool.close()


class LangGraphPostgresCommand(LangGraphPostgres):
    """Contender 1 running the real command `true` per step, each an asyncio subprocess."""

    name = "langgraph+AsyncPostgresSaver, real `true`"
    command = ("true",)


NODE_NAMES = [
    "load_task_context",
    "plan_steps",
    *[n for _ in range(STEPS) for n in ("dispatch_step", "collect_result", "verify_step_result")],
    "finalize_summary",
]


class DBOSWorkflow:
    """Contender 2: the same nodes as DBOS steps in one DBOS workflow, the same upsert in each."""

    name = "DBOS"

    async def open(self, url: str, concurrency: int) -> None:
        from dbos import DBOS
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(url)
        system_url = (
            f"postgresql://{parts.get('user', 'postgres')}@/{parts['dbname']}?host={parts['host']}"
        )
        self.pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=min(concurrency, 20) + 1,
            open=False,
            kwargs={"autocommit": True},
        )
        await self.pool.open(wait=True)
        async with self.pool.connection() as conn:
            await conn.execute(CONTRACT_TABLE)
        pool = self.pool

        @DBOS.step(name=f"node-{id(self)}")
        async def node(task_id: str, name: str, index: int) -> dict[str, Any]:
            state = {"task_id": task_id, "node": name, "index": index}
            async with pool.connection() as conn:
                await conn.execute(
                    UPSERT, {"task_id": task_id, "state": Jsonb(state), "node": name}
                )
            return state

        @DBOS.workflow(name=f"workflow-{id(self)}")
        async def workflow(task_id: str) -> None:
            for index, name in enumerate(NODE_NAMES):
                await node(task_id, name, index)

        self.workflow = workflow
        DBOS(
            config={
                "name": "workflow-engine-bench",
                "system_database_url": system_url,
                "sys_db_pool_size": min(concurrency, 20) + 2,
                "log_level": "WARNING",
            }
        )
        DBOS.launch()

    async def run(self, i: int) -> None:
        await self.workflow(str(uuid.uuid4()))

    async def close(self) -> None:
        from dbos import DBOS

        DBOS.destroy(destroy_registry=True)
        # DBOS made its executor the loop's default and has just shut it down; the next
        # contender (LangGraph runs sync callables there) needs a working one.
        from concurrent.futures import ThreadPoolExecutor

        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor())
        await self.pool.close()


class LangGraphNoPersistence:
    """Floor: the same graph with no persistence at all."""

    name = "langgraph, no persistence"

    async def open(self, url: str, concurrency: int) -> None:
        self.graph = bare_graph(None).compile()

    async def run(self, i: int) -> None:
        await self.graph.ainvoke({"task_id": str(uuid.uuid4())})

    async def close(self) -> None:
        pass


class LangGraphInMemorySaver:
    """Floor for any checkpointer design: LangGraph's own machinery with an in-memory saver."""

    name = "langgraph+InMemorySaver"

    async def open(self, url: str, concurrency: int) -> None:
        from langgraph.checkpoint.memory import InMemorySaver

        self.graph = bare_graph(None).compile(checkpointer=InMemorySaver())

    async def run(self, i: int) -> None:
        task_id = str(uuid.uuid4())
        await self.graph.ainvoke(
            {"task_id": task_id}, {"configurable": {"thread_id": task_id}}, durability="sync"
        )

    async def close(self) -> None:
        pass


class RawUpserts:
    """Floor: one contract-row upsert per node through psycopg, nothing else."""

    name = "raw upserts (12 per workflow)"

    async def open(self, url: str, concurrency: int) -> None:
        self.pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            url, min_size=1, max_size=min(concurrency, 20), open=False, kwargs={"autocommit": True}
        )
        await self.pool.open(wait=True)
        async with self.pool.connection() as conn:
            await conn.execute(CONTRACT_TABLE)

    async def run(self, i: int) -> None:
        task_id = str(uuid.uuid4())
        for n in range(NODES):
            async with self.pool.connection() as conn:
                await conn.execute(
                    UPSERT, {"task_id": task_id, "state": Jsonb({"n": n}), "node": "x"}
                )

    async def close(self) -> None:
        await self.pool.close()


def engine_settings(
    url: str, data_dir: Path, concurrency: int, worker: str = "simulated"
) -> Settings:
    return Settings(
        database_url=url,
        listen="127.0.0.1:0",
        data_dir=data_dir,
        worker=worker,
        recovery_enabled=False,
        pool_min_size=1,
        pool_max_size=min(concurrency, 20) + 2,
        lease_ttl_seconds=60,
        log_level="warning",
        max_running_jobs=max(64, concurrency),  # every workflow's job may run at once
    )


def ended_with_us(*argv: str) -> tuple[str, ...]:
    """`argv` run so that it gets SIGTERM when the benchmark's process ends, even killed: a
    stopped benchmark leaves no engine or worker node behind (Linux's parent-death signal, set
    by util-linux `setpriv`, which then execs `argv` in its place)."""
    setpriv = shutil.which("setpriv")
    return (setpriv, "--pdeathsig", "TERM", "--", *argv) if setpriv else argv


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


#: Connections `spread_channels` opens at most, in all, to spread its channels evenly.
MAX_REDIALS = 50


def connection(address: str) -> grpc.aio.Channel:
    """A channel on a connection of its own (gRPC would share one between channels)."""
    return grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def engine_processes(address: str, server_pid: int) -> list[psutil.Process]:
    """The processes of `serve` (pid `server_pid`) that run workflows: those listening on
    `address`'s port (`serve` itself, or the engine processes it supervises)."""
    port = int(address.rsplit(":", 1)[1])

    def listening(process: psutil.Process) -> bool:
        try:
            connections = process.net_connections("tcp")
        except psutil.NoSuchProcess:  # a job that ended meanwhile
            return False
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in connections)

    server = psutil.Process(server_pid)
    return [process for process in [server, *server.children(recursive=True)] if listening(process)]


async def spread_channels(address: str, server_pid: int, count: int) -> list[grpc.aio.Channel]:
    """`count` channels to `serve` at `address` (pid `server_pid`), spread as evenly as `count`
    allows over its engine processes (the processes listening on the port).

    Each channel is one connection, and the kernel hands a connection to one of the processes
    listening on the port by a hash of its addresses (`SO_REUSEPORT`): 4 connections to 2
    processes land 3:1 or 4:0 five times in eight, and a row would measure that luck rather
    than the engine. So a connection that lands on a process that has its share already is
    replaced by a new one (a new client port, a new hash), for at most `MAX_REDIALS` tries.
    """
    port = int(address.rsplit(":", 1)[1])
    engines = engine_processes(address, server_pid)
    if len(engines) <= 1:
        return [connection(address) for _ in range(count)]
    share = -(-count // len(engines))  # ceil
    me = psutil.Process()

    def my_ports() -> set[int]:
        return {c.laddr.port for c in me.net_connections("tcp") if c.raddr and c.raddr.port == port}

    kept: list[grpc.aio.Channel] = []
    spare: list[grpc.aio.Channel] = []
    per_engine: dict[int, int] = {}
    seen = my_ports()
    for _ in range(MAX_REDIALS):
        if len(kept) == count:
            break
        channel = connection(address)
        await asyncio.wait_for(channel.channel_ready(), 10)
        mine = my_ports()
        pid = await accepted_by(engines, port, mine - seen)
        seen = mine
        if pid is not None and per_engine.get(pid, 0) < share:
            per_engine[pid] = per_engine.get(pid, 0) + 1
            kept.append(channel)
        else:
            spare.append(channel)
    missing = count - len(kept)
    kept += spare[:missing]  # out of tries: as many as asked for, even if uneven
    for channel in spare[missing:]:
        await channel.close()
    return kept


async def accepted_by(
    engines: list[psutil.Process], port: int, client_ports: set[int]
) -> int | None:
    """The pid of the one engine holding the connection from `client_ports` (a connection
    the client sees as ready may wait a moment in the kernel before an engine takes it)."""
    for _ in range(40):
        holders = [
            engine.pid
            for engine in engines
            for c in engine.net_connections("tcp")
            if c.laddr.port == port and c.raddr and c.raddr.port in client_ports
        ]
        if holders:
            return holders[0] if len(holders) == 1 else None
        await asyncio.sleep(0.025)
    return None


async def wait_serving(address: str, proc: asyncio.subprocess.Process) -> None:
    """Until the engine at `address` answers its health check SERVING (it may still be
    migrating the database)."""
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for _ in range(1200):
            if proc.returncode is not None:
                raise RuntimeError(f"engine exited ({proc.returncode}) before serving")
            try:
                answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"engine at {address} not serving after 60 s")


class EngineInProcess:
    """Contender 3: this engine's run manager, lease, fenced checkpoint and graph; no gRPC."""

    name = "engine in-process"
    worker = "simulated"

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    async def open(self, url: str, concurrency: int) -> None:
        settings = engine_settings(url, self.data_dir, concurrency, self.worker)
        self.engine = await Engine(settings).open()

    async def run(self, i: int) -> None:
        workflow = await self.engine.start(engine_task())
        async with asyncio.timeout(600):
            await workflow.wait()

    async def close(self) -> None:
        await self.engine.close()


class EngineGrpc:
    """Contender 4: this engine as `workflow-engine serve`, driven by a gRPC client here."""

    name = "engine via gRPC"
    worker = "simulated"
    processes = 1  # engine processes `serve` runs (WORKFLOW_ENGINE_PROCESSES)
    watch_kinds: tuple[int, ...] = ()  # WatchWorkflowRequest.kinds: every event

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        # Seconds from one NODE_COMPLETED to the next as the client receives them (the first
        # from the StartWorkflow call): a node's latency as a watcher sees it. Every-event
        # watches only.
        self.node_gaps: list[float] = []

    async def open(self, url: str, concurrency: int) -> None:
        import os

        settings = engine_settings(url, self.data_dir, concurrency)
        # A port of its own, since at the in-process contender's log level (warning: nothing per
        # workflow, so the two differ by the transport alone) `serve` does not log its address.
        self.address = f"127.0.0.1:{free_port()}"
        env = {
            **os.environ,
            **{
                f"WORKFLOW_ENGINE_{k.upper()}": str(v)
                for k, v in {
                    "database_url": url,
                    "listen": self.address,
                    "data_dir": settings.data_dir,
                    "worker": self.worker,
                    "recovery_enabled": "false",
                    "log_level": settings.log_level,
                    "pool_max_size": settings.pool_max_size,
                    "processes": self.processes,
                }.items()
            },
            **await self.worker_env(concurrency),
        }
        self.proc = await asyncio.create_subprocess_exec(
            *ended_with_us(*self.server_argv(url)), env=env, stderr=asyncio.subprocess.PIPE
        )
        await wait_serving(self.address, self.proc)
        self._drain = asyncio.create_task(self._read_rest())
        # A client per 5 concurrent workflows, each on its own connection (gRPC would share one
        # between channels): with several engine processes, each connection reaches one of them.
        self.channels = await spread_channels(self.address, self.proc.pid, max(1, concurrency // 5))
        self.stubs = [pb_grpc.WorkflowEngineStub(c) for c in self.channels]
        self._next = 0

    def server_argv(self, url: str) -> tuple[str, ...]:
        """The server this contender's client drives (configured by the environment)."""
        return (str(Path(sys.executable).parent / "workflow-engine"), "serve")

    async def worker_env(self, concurrency: int) -> dict[str, str]:
        """Variables the engine's worker needs besides `WORKFLOW_ENGINE_WORKER`."""
        return {}

    async def _read_rest(self) -> None:
        assert self.proc.stderr is not None
        while await self.proc.stderr.readline():
            pass

    async def run(self, i: int) -> None:
        task_id = str(uuid.uuid4())
        self._next += 1
        stub = self.stubs[self._next % len(self.stubs)]  # start and watch on one connection
        await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=ENGINE_TASK))
        started = time.perf_counter()
        watch = pb.WatchWorkflowRequest(task_id=task_id, kinds=self.watch_kinds)
        events = []
        async for event in stub.WatchWorkflow(watch):
            events.append(event)
            if event.kind == pb.NODE_COMPLETED:
                now = time.perf_counter()
                self.node_gaps.append(now - started)
                started = now
        if events[-1].status != pb.SUCCEEDED:
            raise RuntimeError(f"workflow ended {events[-1].status}")

    def server_pid(self) -> int:
        return self.proc.pid

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()
        self.proc.terminate()
        await self.proc.wait()
        self._drain.cancel()


class EngineGrpcCommand(EngineGrpc):
    """Contender 4 running the real command `true` per step through the default worker.

    The default worker is the local sandbox: each step is a real process with its own job
    directory, re-attachable by job id after a crash. Beside `LangGraphPostgresCommand` it
    shows what that durability costs on top of starting the process.
    """

    name = "engine via gRPC, real `true`"
    worker = "sandbox"


class EngineCommandInProcess(EngineInProcess):
    """Contender 3 running the real command `true` per step through the default worker (the
    local sandbox): beside `EngineGrpcCommand` it shows what the job path costs apart from
    gRPC. Named so that ``--only "engine in-process"`` still picks contender 3 alone."""

    name = "engine, real `true`, in-process"
    worker = "sandbox"


class EngineGrpcOutcome(EngineGrpc):
    """Contender 4 with a client that watches for the outcome only (status changes), as an
    orchestrator that does not show each node would: what `EngineInProcess` waits for too."""

    name = "engine via gRPC, outcome only"
    watch_kinds = (pb.STATUS_CHANGED,)


class EngineGrpcCommandOutcome(EngineGrpcCommand):
    """The real-command contender with a client that watches for the outcome only."""

    name = "engine via gRPC, real `true`, outcome only"
    watch_kinds = (pb.STATUS_CHANGED,)


class EngineGrpcProcesses(EngineGrpc):
    """Contender 4 as `serve` runs by default here: one engine process per core (2)."""

    name = "engine via gRPC, 2 processes"
    processes = 2


class EngineGrpcCommandProcesses(EngineGrpcCommand):
    """The real-command contender with one engine process per core (2), the default."""

    name = "engine via gRPC, real `true`, 2 processes"
    processes = 2


class EngineGrpcTelemetry(EngineGrpc):
    """Contender 4 with metrics and traces on: Prometheus metrics recorded (and served), and
    every RPC, run, node and job a span exported over OTLP to a receiver in this process.
    Beside contender 4 (both off, the default) it shows what they cost."""

    name = "engine via gRPC, metrics and traces on"

    async def worker_env(self, concurrency: int) -> dict[str, str]:
        sys.path.insert(0, REPOSITORY)
        from tests.support.otlp_receiver import (
            OtlpReceiver,  # the receiver the tests read spans from
        )

        self.receiver = OtlpReceiver()
        return {
            "WORKFLOW_ENGINE_METRICS_LISTEN": "127.0.0.1:0",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.receiver.endpoint,
        }

    async def close(self) -> None:
        await super().close()
        self.receiver.stop()


class EngineGrpcNode(EngineGrpcCommand):
    """Contender 4 with its real `true` steps sent to one local `workflow-engine worker-node`
    over the Worker API: beside `EngineGrpcCommand`, what the HTTP hop to a node adds."""

    name = "engine via gRPC, real `true`, one worker node"
    worker = "nodes"

    async def worker_env(self, concurrency: int) -> dict[str, str]:
        import json
        import os

        token = uuid.uuid4().hex
        self.node = await asyncio.create_subprocess_exec(
            *ended_with_us(
                str(Path(sys.executable).parent / "workflow-engine"),
                "worker-node",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                str(self.data_dir / "node"),
            ),
            env={**os.environ, "WORKFLOW_ENGINE_NODE_TOKEN": token},
            stderr=asyncio.subprocess.PIPE,
        )
        assert self.node.stderr is not None
        while True:
            line = await self.node.stderr.readline()
            if not line:
                raise RuntimeError("worker node exited before serving")
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if entry.get("event") == "serving":
                address = entry["address"]
                break
        self._node_drain = asyncio.create_task(_drain_lines(self.node.stderr))
        (self.data_dir / "node.token").write_text(token)
        (self.data_dir / "node.token").chmod(0o600)  # the engine refuses a token others may read
        nodes_file = self.data_dir / "nodes.json"
        entry = {
            "name": "node-1",
            "url": f"http://{address}",
            "token_file": str(self.data_dir / "node.token"),
            "max_jobs": max(8, 2 * concurrency),
        }
        nodes_file.write_text(json.dumps([entry]))
        return {"WORKFLOW_ENGINE_NODES_FILE": str(nodes_file)}

    async def close(self) -> None:
        await super().close()
        self.node.terminate()
        await self.node.wait()
        self._node_drain.cancel()


async def _drain_lines(stream: asyncio.StreamReader) -> None:
    while await stream.readline():
        pass


class ServedPeer(EngineGrpcCommand):
    """What a user would write instead, served: LangGraph + `AsyncPostgresSaver` behind the
    same gRPC contract (`benchmarks/served_peer.py`), each step `true` as an asyncio
    subprocess, driven by the same client as the engine's gRPC rows."""

    name = "served peer: langgraph+AsyncPostgresSaver via gRPC, real `true`"

    def server_argv(self, url: str) -> tuple[str, ...]:
        peer = str(Path(__file__).resolve().parent / "served_peer.py")
        return (sys.executable, peer, "--database-url", url, "--listen", self.address)


class ServedPeerOutcome(ServedPeer):
    """The served peer with a client that watches for the outcome only."""

    name = "served peer: langgraph+AsyncPostgresSaver via gRPC, real `true`, outcome only"
    watch_kinds = (pb.STATUS_CHANGED,)
