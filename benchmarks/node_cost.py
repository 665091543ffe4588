"""What one workflow costs: latency, and the database statements and commits per node.

Runs the engine in-process behind its real gRPC server on the embedded PostgreSQL, drives N
two-step workflows one after another (steps run `true` in the local sandbox), and has the
server log every statement of the benchmark database (`log_statement = all`). Statements are
counted from that log, per backend, so the figures are exact round trips, not estimates.

    .venv/bin/python benchmarks/node_cost.py [--workflows 30]

Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import grpc
import psycopg
from bench_postgres import PGDATA, run_on_bench_postgres
from psycopg.conninfo import make_conninfo

from workflow_engine import Engine, Settings
from workflow_engine._logs import configure_logging
from workflow_engine._serving import GrpcServer
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

NODES_PER_WORKFLOW = 9  # load, plan, 2 x (dispatch, collect, verify), finalize
CLIENT_READS = "client reads (Watch/Get)"
LOG_LINE = re.compile(r"\[(\d+)\] LOG:\s+(?:statement|execute [^:]*): (.*)")


def classify(sql: str) -> str:
    s = " ".join(sql.split())
    if s.startswith("WITH input AS"):  # storage/_group_commit.py
        return "checkpoint write (fenced upsert + events)"
    if s.startswith(("BEGIN", "COMMIT", "ROLLBACK")):
        return "transaction control"
    if "FROM workflow_events" in s or "FROM workflow_checkpoints c LEFT JOIN" in s:
        return CLIENT_READS
    if "task_workflow_leases" in s:
        return "lease (acquire/lock/release)"
    if s.startswith(
        (
            "INSERT INTO workflow_checkpoints",
            "INSERT INTO workflow_events",
            "INSERT INTO workflow_tasks",
        )
    ):
        return "start: create row, task, first event"
    if s.startswith("SELECT spec FROM workflow_tasks"):
        return "task source load"
    if s.startswith("SELECT state, checkpoint_id"):
        return "checkpoint read (resume point)"
    return "other: " + s[:40]


def count_statements(log: Path, start: int) -> tuple[Counter[str], int]:
    """Statements by kind since byte `start`, and commits (autocommit statements + COMMIT)."""
    kinds: Counter[str] = Counter()
    commits = 0
    in_tx: set[str] = set()
    for pid, sql in _statements(log, start):
        if "LISTEN" in sql:
            continue
        kind = classify(sql)
        kinds[kind] += 1
        if kind == CLIENT_READS:
            continue  # the benchmark's own watching, not the engine's cost
        if sql.startswith("BEGIN"):
            in_tx.add(pid)
        elif sql.startswith(("COMMIT", "ROLLBACK")):
            in_tx.discard(pid)
            commits += sql.startswith("COMMIT")
        elif pid not in in_tx:
            commits += 1
    return kinds, commits


def _statements(log: Path, start: int) -> list[tuple[str, str]]:
    """(backend pid, statement) for each logged statement; continuation lines start with a tab."""
    out: list[tuple[str, str]] = []
    with log.open("rb") as f:
        f.seek(start)
        for raw in f:
            line = raw.decode(errors="replace")
            if line.startswith("\t") and out:
                out[-1] = (out[-1][0], out[-1][1] + " " + line.strip())
                continue
            m = LOG_LINE.search(line)
            if m:
                out.append((m.group(1), m.group(2).strip()))
    return out


async def run(server_url: str, workflows: int) -> dict[str, object]:
    db = f"bench_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {db}")
        await admin.execute(f"ALTER DATABASE {db} SET log_statement = 'all'")
    url = make_conninfo(server_url, dbname=db)
    log = PGDATA / "log"
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(database_url=url, listen="127.0.0.1:0", data_dir=Path(tmp))
        engine = await Engine(settings).open()
        server = GrpcServer(engine)
        await server.start()
        latencies: list[float] = []
        try:
            async with grpc.aio.insecure_channel(server.address) as channel:
                stub = pb_grpc.WorkflowEngineStub(channel)
                spec = pb.TaskSpec(
                    steps=[pb.Step(id="one", command=["true"]), pb.Step(id="two", command=["true"])]
                )
                for i in range(workflows + 3):  # three warm-ups, not counted
                    if i == 3:
                        await asyncio.sleep(0.2)
                        offset = log.stat().st_size
                    task_id = str(uuid.uuid4())
                    t0 = time.perf_counter()
                    await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
                    request = pb.WatchWorkflowRequest(task_id=task_id)
                    events = [e async for e in stub.WatchWorkflow(request)]
                    if i >= 3:
                        latencies.append(time.perf_counter() - t0)
                    assert events[-1].status == pb.SUCCEEDED, events[-1]
                    print(f"\rworkflow {i + 1}/{workflows + 3}", end="", file=sys.stderr)
                print(file=sys.stderr)
                await asyncio.sleep(0.5)  # let the last log lines reach the file
        finally:
            await server.stop(drain_timeout=5)
    kinds, commits = count_statements(log, offset)
    nodes = workflows * NODES_PER_WORKFLOW
    engine_statements = sum(n for k, n in kinds.items() if k != CLIENT_READS)
    latencies.sort()
    return {
        "workflows": workflows,
        "nodes_per_workflow": NODES_PER_WORKFLOW,
        "latency_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "latency_p95_ms": round(latencies[int(0.95 * (len(latencies) - 1))] * 1000, 1),
        "checkpoint_writes_per_node": kinds["checkpoint write (fenced upsert + events)"] / nodes,
        "engine_statements_per_node": round(engine_statements / nodes, 2),
        "engine_commits_per_node": round(commits / nodes, 2),
        "statements_per_workflow": {k: n / workflows for k, n in sorted(kinds.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=30)
    args = parser.parse_args()
    configure_logging("warning")
    result = run_on_bench_postgres(lambda url: run(url, args.workflows))
    print(f"{'figure':<44} value")
    for key, value in result.items():
        if isinstance(value, dict):
            for kind, n in value.items():
                print(f"  statements/workflow: {kind:<29} {n:g}")
        else:
            print(f"{key:<44} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
