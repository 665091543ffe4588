"""`make bench`: what durability costs, side by side, in one run on one PostgreSQL.

Every contender runs the same 12-node workflow shape at each concurrency; each point gets a
fresh database on the same embedded server. Per point: workflows/s, node transitions/s,
p50/p99 workflow latency, CPU per workflow (benchmark process, plus the server
process for the gRPC contender; then the whole machine's, every process and the kernel, and
PostgreSQL's alone: on two cores the machine's is what bounds throughput), commits per node
(pg_stat_database.xact_commit, read after the contender's connections closed so their
statistics are flushed) and WAL bytes per node
(pg_current_wal_lsn before and after). Prints a table and a JSON line, writes
bench-results/compare.json and a PNG of throughput against concurrency. Two contenders run
the real command `true` in each step (this engine through its default worker, the local
sandbox, and LangGraph + AsyncPostgresSaver with an asyncio subprocess); their ratio is
printed beside the ratios to contender 1 (`PAIRS`). Those (`ROUNDS_OF`) run again in further
rounds, alternating their order, and each of their ratios is the median of the rounds'.

    .venv/bin/python benchmarks/compare.py [--smoke] [--concurrency 1 20 100] [--only WORD ...]
        [--workflows N] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_postgres import PGDATA, run_on_bench_postgres
from contenders import (
    NODES,
    STEPS,
    DBOSWorkflow,
    EngineCommandInProcess,
    EngineGrpc,
    EngineGrpcCommand,
    EngineGrpcCommandOutcome,
    EngineGrpcCommandProcesses,
    EngineGrpcNode,
    EngineGrpcOutcome,
    EngineGrpcProcesses,
    EngineGrpcTelemetry,
    EngineInProcess,
    LangGraphInMemorySaver,
    LangGraphNoPersistence,
    LangGraphPostgres,
    LangGraphPostgresCommand,
    RawUpserts,
    ServedPeer,
    ServedPeerOutcome,
)

from workflow_engine._logs import configure_logging

BASELINE = LangGraphPostgres.name  # contender 1: what the targets are ratios of
# The targets: (contender, its peer, {concurrency: least ratio}). The first is the target row:
# the engine served, real `true` per step through the default worker, against what a user
# would write instead, served behind the same contract and driven by the same client.
TARGETS = [
    (EngineGrpcCommand.name, ServedPeer.name, {1: 2.5, 20: 3.0, 100: 2.5}),
    (EngineGrpcCommandOutcome.name, ServedPeerOutcome.name, {1: 2.5, 20: 3.0, 100: 2.5}),
    (EngineInProcess.name, LangGraphPostgres.name, {20: 4.0}),
]
# Pairs running the same real commands, each a ratio of its own baseline.
PAIRS = [
    *((name, peer) for name, peer, _ in TARGETS),
    (EngineGrpcCommand.name, LangGraphPostgresCommand.name),
    (EngineGrpcCommandOutcome.name, LangGraphPostgresCommand.name),
    (EngineGrpcCommandProcesses.name, LangGraphPostgresCommand.name),
    (EngineCommandInProcess.name, LangGraphPostgresCommand.name),
    (EngineGrpcNode.name, EngineGrpcCommand.name),
    # Every core (target 1.7x), and the gRPC path against in-process (target 0.9).
    (EngineGrpcProcesses.name, EngineGrpc.name),
    (EngineGrpc.name, EngineInProcess.name),
    (EngineGrpcOutcome.name, EngineInProcess.name),
    (EngineGrpcProcesses.name, EngineInProcess.name),
    # What metrics and traces cost when on (off, the default, is contender 4 itself).
    (EngineGrpcTelemetry.name, EngineGrpc.name),
]
# The 2.5x target's contenders, measured again in alternating rounds after the first: this
# machine's speed drifts by up to half within minutes, so one measurement of each, a minute
# apart, can move the ratio that much; the median of the rounds' ratios does not.
ROUNDS_OF = (
    ServedPeer.name,
    ServedPeerOutcome.name,
    LangGraphPostgres.name,
    EngineInProcess.name,
    LangGraphPostgresCommand.name,
    EngineCommandInProcess.name,
    EngineGrpcCommand.name,
    EngineGrpcCommandOutcome.name,
    EngineGrpcCommandProcesses.name,
)
# The rows whose database cost is counted, statements included (`database_cost`).
COST_OF = (ServedPeer.name, EngineGrpcCommand.name, EngineGrpcCommandOutcome.name)
ROOT = Path(__file__).resolve().parent.parent
SERVER_LOG = PGDATA / "log"
LOGGED_STATEMENT = re.compile(rb"\] LOG:\s+(?:statement|execute [^:]*): ")
# Per point of the database-cost pass (statements logged, so not a throughput figure).
COST_WORKFLOWS = 100
OUT = ROOT / "bench-results"


async def measure(
    contender: Any, server_url: str, concurrency: int, workflows: int, *, statements: bool = False
) -> dict[str, Any]:
    """One point. With `statements`, the server also logs every statement of the point's
    database (which slows it: a pass of its own, not a throughput figure), counted in
    `statements_per_workflow`."""
    db = f"bench_{uuid.uuid4().hex[:8]}"
    async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {db}")
        if statements:
            await admin.execute(f"ALTER DATABASE {db} SET log_statement = 'all'")
    url = make_conninfo(server_url, dbname=db)

    async def stats() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("SET log_statement = 'none'")  # this reading is not counted
            await asyncio.sleep(0.6)  # other backends flush their statistics about every second
            cur = await conn.execute(
                "SELECT xact_commit, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
                " FROM pg_stat_database WHERE datname = current_database()"
            )
            row = await cur.fetchone()
            assert row is not None
            return int(row[0]), int(row[1])

    await contender.open(url, concurrency)
    try:
        await asyncio.gather(*(contender.run(-1) for _ in range(min(concurrency, 5))))  # warm up
        node_gaps = getattr(contender, "node_gaps", [])
        node_gaps.clear()
        commits0, wal0 = await stats()
        log_start = SERVER_LOG.stat().st_size if statements else 0
        server = (
            psutil.Process(contender.server_pid()) if hasattr(contender, "server_pid") else None
        )
        own0, served0 = time.process_time(), server_cpu(server)
        machine0, postgres0 = machine_cpu(), postgres_cpu()
        latencies: list[float] = []
        queue = iter(range(workflows))

        async def lane() -> None:
            for i in queue:
                t0 = time.perf_counter()
                await contender.run(i)
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
        served = server_cpu(server) - served0
        cpu = time.process_time() - own0 + served
        machine, postgres = machine_cpu() - machine0, postgres_cpu() - postgres0
    finally:
        await contender.close()  # closing flushes the backends' statistics
    commits1, wal1 = await stats()
    # The last stats reading's `SET log_statement` is logged (as it is set); it is not the
    # contender's.
    logged = count_logged_statements(log_start) - 1 if statements else None
    nodes = workflows * NODES
    latencies.sort()
    async with await psycopg.AsyncConnection.connect(server_url, autocommit=True) as admin:
        await admin.execute(f"DROP DATABASE {db} WITH (FORCE)")
    return {
        "contender": contender.name,
        "concurrency": concurrency,
        "workflows": workflows,
        "workflows_per_s": round(workflows / wall, 1),
        "nodes_per_s": round(nodes / wall, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1000, 1),
        # A node's latency as an every-event watcher sees it: NODE_COMPLETED to the next.
        "node_p50_ms": percentile_ms(node_gaps, 0.5),
        "node_p99_ms": percentile_ms(node_gaps, 0.99),
        "cpu_ms_per_workflow": round(cpu / workflows * 1000, 2),
        # Of that, the served engine's processes (the rest is the benchmark's client).
        "engine_cpu_ms_per_workflow": round(served / workflows * 1000, 2) if server else None,
        "machine_cpu_ms_per_workflow": round(machine / workflows * 1000, 2),
        "postgres_cpu_ms_per_workflow": round(postgres / workflows * 1000, 2),
        # The stats query itself commits once per reading; it is not the contender's.
        "commits_per_node": round((commits1 - commits0 - 1) / nodes, 2),
        "wal_bytes_per_node": round((wal1 - wal0) / nodes),
        "commits_per_workflow": round((commits1 - commits0 - 1) / workflows, 1),
        "wal_bytes_per_workflow": round((wal1 - wal0) / workflows),
        "statements_per_workflow": None if logged is None else round(logged / workflows, 1),
    }


def count_logged_statements(start: int) -> int:
    """Statements the server logged since byte `start` of its log (`log_statement = all`
    is set on the measured database alone), waiting for the last lines to reach the file."""
    time.sleep(0.5)
    with SERVER_LOG.open("rb") as log:
        log.seek(start)
        return sum(1 for line in log if LOGGED_STATEMENT.search(line))


def percentile_ms(seconds: list[float], q: float) -> float | None:
    if not seconds:
        return None
    ordered = sorted(seconds)
    return round(ordered[int(q * (len(ordered) - 1))] * 1000, 2)


def server_cpu(server: psutil.Process | None) -> float:
    """CPU seconds of the served engine: its process and every engine process it supervises."""
    if server is None:
        return 0.0
    return sum(sum(p.cpu_times()[:2]) for p in [server, *server.children(recursive=True)])


def machine_cpu() -> float:
    """CPU seconds every process of this machine has used (a job's `true` included), so far."""
    times = psutil.cpu_times()
    return float(times.user + times.nice + times.system + times.irq + times.softirq)


def postgres_cpu() -> float:
    """CPU seconds of the benchmark's PostgreSQL: its postmaster, its live processes and the
    backends that have exited (the postmaster reaped them, so they count as its children)."""
    try:
        postmaster = psutil.Process(int((PGDATA / "postmaster.pid").read_text().split()[0]))
        own = postmaster.cpu_times()
        total = own.user + own.system + own.children_user + own.children_system
        for child in postmaster.children():
            with contextlib.suppress(psutil.Error):  # a backend that ended just now
                total += sum(child.cpu_times()[:2])
    except (OSError, IndexError, ValueError, psutil.Error):
        return 0.0
    return float(total)


def contenders(data_dir: Path) -> list[Any]:
    return [
        LangGraphPostgres(),
        DBOSWorkflow(),
        EngineInProcess(data_dir),
        EngineGrpc(data_dir),
        EngineGrpcOutcome(data_dir),
        EngineGrpcProcesses(data_dir),
        EngineGrpcTelemetry(data_dir),
        LangGraphPostgresCommand(),
        ServedPeer(data_dir),
        ServedPeerOutcome(data_dir),
        EngineCommandInProcess(data_dir),
        EngineGrpcCommand(data_dir),
        EngineGrpcCommandOutcome(data_dir),
        EngineGrpcCommandProcesses(data_dir),
        EngineGrpcNode(data_dir),
        LangGraphNoPersistence(),
        LangGraphInMemorySaver(),
        RawUpserts(),
    ]


async def run(
    server_url: str,
    concurrencies: list[int],
    smoke: bool,
    only: list[str] | None = None,
    workflows_per_point: int | None = None,
    rounds: int = 1,
) -> list[dict[str, Any]]:
    """Every contender once per concurrency (round 1), then `ROUNDS_OF` alone for the rounds
    left, in reverse order every other round."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for concurrency in concurrencies:
            workflows = workflows_per_point or (4 if smoke else max(60, concurrency * 6))
            chosen = [
                c for c in contenders(Path(tmp)) if not only or any(word in c.name for word in only)
            ]
            order = [(1, c) for c in chosen]
            again = [c.name for c in chosen if c.name in ROUNDS_OF]
            for round_ in range(2, rounds + 1):
                names = again if round_ % 2 else again[::-1]
                fresh = {c.name: c for c in contenders(Path(tmp))}
                order += [(round_, fresh[name]) for name in names]
            for round_, contender in order:
                print(
                    f"  {contender.name} at concurrency {concurrency}"
                    + (f", round {round_} of {rounds}" if contender.name in again else "")
                    + " ...",
                    file=sys.stderr,
                    flush=True,
                )
                result = await measure(contender, server_url, concurrency, workflows)
                results.append({**result, "round": round_})
    return results


async def database_cost(
    server_url: str, concurrency: int, workflows: int, only: list[str] | None = None
) -> list[dict[str, Any]]:
    """What a workflow costs PostgreSQL, the engine's served rows beside the served peer's:
    commits, WAL bytes and statements per workflow, in a pass of its own (`COST_OF`), since
    logging every statement slows the server."""
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for contender in contenders(Path(tmp)):
            if contender.name not in COST_OF or (
                only and not any(word in contender.name for word in only)
            ):
                continue
            print(
                f"  {contender.name}: database cost at concurrency {concurrency} ...",
                file=sys.stderr,
                flush=True,
            )
            result = await measure(contender, server_url, concurrency, workflows, statements=True)
            out.append(
                {
                    key: result[key]
                    for key in (
                        "contender",
                        "concurrency",
                        "workflows",
                        "commits_per_workflow",
                        "wal_bytes_per_workflow",
                        "statements_per_workflow",
                    )
                }
            )
    return out


def table(results: list[dict[str, Any]]) -> str:
    cols = list(results[0])
    cell = {(id(r), c): "-" if r[c] is None else str(r[c]) for r in results for c in cols}
    widths = {c: max(len(c), *(len(cell[id(r), c]) for r in results)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(cell[id(r), c].ljust(widths[c]) for c in cols) for r in results]
    return "\n".join(lines)


def ratios(results: list[dict[str, Any]]) -> dict[str, float]:
    """Throughput of each contender over contender 1's, and of each of `PAIRS`, per concurrency.

    A pair measured in several rounds gets the median of its rounds' ratios (each round's two
    figures measured close together), `rounds_of_ratios` lists them."""
    out = {}
    rate = {(r["contender"], r["concurrency"]): r["workflows_per_s"] for r in first(results)}
    for r in first(results):
        base = rate.get((BASELINE, r["concurrency"]))
        if r["contender"] != BASELINE and base:
            out[f"{r['contender']} / langgraph+saver @ c={r['concurrency']}"] = round(
                r["workflows_per_s"] / base, 2
            )
    for key, each in rounds_of_ratios(results).items():
        out[key] = round(statistics.median(each), 2)
    return out


def rounds_of_ratios(results: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each of `PAIRS`' ratio per concurrency, one per round both of its contenders ran."""
    rate = {(r["contender"], r["concurrency"], r["round"]): r["workflows_per_s"] for r in results}
    out: dict[str, list[float]] = {}
    for name, baseline in PAIRS:
        for concurrency in dict.fromkeys(r["concurrency"] for r in results):
            for round_ in sorted({r["round"] for r in results}):
                ours = rate.get((name, concurrency, round_))
                theirs = rate.get((baseline, concurrency, round_))
                if ours and theirs:
                    key = f"{name} / {baseline} @ c={concurrency}"
                    out.setdefault(key, []).append(round(ours / theirs, 2))
    return out


def target_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each of `TARGETS` per concurrency measured: the median of its rounds' ratios."""
    each = rounds_of_ratios(results)
    rows = []
    for name, peer, least in TARGETS:
        for concurrency, target in least.items():
            got = each.get(f"{name} / {peer} @ c={concurrency}")
            if got:
                ratio = round(statistics.median(got), 2)
                rows.append(
                    {
                        "contender": name,
                        "peer": peer,
                        "concurrency": concurrency,
                        "ratio": ratio,
                        "rounds": got,
                        "target": target,
                        "met": ratio >= target,
                    }
                )
    return rows


def added_node_latency(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency, a node's latency as an every-event watcher sees it, the served
    engine's (real `true`) beside the served peer's, and what the engine adds (negative: what
    it saves): the median over the rounds both ran of each round's difference."""
    by = {(r["contender"], r["concurrency"], r["round"]): r for r in results}
    out = []
    for concurrency in dict.fromkeys(r["concurrency"] for r in results):
        pairs = [
            (by[EngineGrpcCommand.name, concurrency, n], by[ServedPeer.name, concurrency, n])
            for n in sorted({r["round"] for r in results})
            if (EngineGrpcCommand.name, concurrency, n) in by
            and (ServedPeer.name, concurrency, n) in by
        ]
        pairs = [
            (ours, theirs)
            for ours, theirs in pairs
            if ours["node_p50_ms"] is not None and theirs["node_p50_ms"] is not None
        ]
        if not pairs:
            continue
        row: dict[str, Any] = {"concurrency": concurrency, "rounds": len(pairs)}
        for q in ("p50", "p99"):
            key = f"node_{q}_ms"
            row[f"engine_{q}_ms"] = round(statistics.median(ours[key] for ours, _ in pairs), 2)
            row[f"peer_{q}_ms"] = round(statistics.median(theirs[key] for _, theirs in pairs), 2)
            row[f"added_{q}_ms"] = round(
                statistics.median(ours[key] - theirs[key] for ours, theirs in pairs), 2
            )
        out.append(row)
    return out


def first(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first round's results: every contender once per concurrency."""
    return [r for r in results if r["round"] == 1]


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r["contender"] for r in results):
        points = [
            (r["concurrency"], r["workflows_per_s"])
            for r in first(results)
            if r["contender"] == name
        ]
        ax.plot(*zip(*points, strict=True), marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("concurrent workflows")
    ax.set_ylabel("workflows / s (12 nodes each)")
    ax.set_title("Throughput against concurrency, same PostgreSQL, same run")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_inflight(workflows: int, job_seconds: float, *, wait: bool) -> dict[str, Any]:
    """benchmarks/inflight.py in its own process, so its peak RSS is the engine's alone."""
    print(
        f"  engine with {workflows} workflows in flight, jobs of {job_seconds} s ...",
        file=sys.stderr,
        flush=True,
    )
    command = [
        sys.executable,
        str(Path(__file__).parent / "inflight.py"),
        "--workflows",
        str(workflows),
        "--job-seconds",
        str(job_seconds),
    ]
    done = subprocess.run(
        command + ([] if wait else ["--no-wait"]), capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def fair_share(inflight: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """The in-flight run's jobs/s against the smaller of the ideal and the engine's own ceiling:
    the same engine with zero-length jobs at the highest concurrency measured in this run."""
    points = [r for r in first(results) if r["contender"] == EngineInProcess.name]
    if not points:
        return {}
    top = max(points, key=lambda r: r["concurrency"])
    ceiling = top["workflows_per_s"] * STEPS
    bound = min(inflight["ideal_jobs_per_s"], ceiling)
    return {
        "ceiling_jobs_per_s": round(ceiling, 1),
        "ceiling_concurrency": top["concurrency"],
        "share_of_fair_bound": round(inflight["jobs_per_s"] / bound, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few workflows per contender")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 20, 100])
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="WORD",
        help="run just the contenders whose name contains a WORD (e.g. to profile one); "
        "skips the in-flight run, the files and the plot",
    )
    parser.add_argument(
        "--workflows", type=int, help="workflows per point (default 6 x concurrency)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        help="rounds of the real-`true` target's contenders (default 3, 2 with --smoke); "
        "their ratios are the median of the rounds'",
    )
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.smoke else 3)
    configure_logging("warning")
    cost_concurrency = 20 if 20 in args.concurrency else max(args.concurrency)

    async def everything(url: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        results = await run(url, args.concurrency, args.smoke, args.only, args.workflows, rounds)
        cost_workflows = 4 if args.smoke else COST_WORKFLOWS
        return results, await database_cost(url, cost_concurrency, cost_workflows, args.only)

    results, cost = run_on_bench_postgres(everything)
    print(table(results))
    each, overall = rounds_of_ratios(results), ratios(results)
    for name, value in overall.items():
        rounds_note = (
            f" (median of rounds: {', '.join(map(str, each[name]))})"
            if len(each.get(name, ())) > 1
            else ""
        )
        print(f"{name}: {value}x{rounds_note}")
    targets, latency = target_rows(results), added_node_latency(results)
    print("\ntargets (median of the rounds' ratios):")
    for row in targets:
        verdict = "met" if row["met"] else "NOT MET"
        print(
            f"  {row['contender']} / {row['peer']} @ c={row['concurrency']}: {row['ratio']}x"
            f" (target {row['target']}x: {verdict}; rounds {', '.join(map(str, row['rounds']))})"
        )
    if latency:
        print("\nlatency per node, every-event watch, engine real `true` against the served peer:")
        print(table(latency))
    if cost:
        print(f"\nPostgreSQL cost per workflow at concurrency {cost_concurrency}:")
        print(table(cost))
    if args.only:
        return
    inflight = run_inflight(20 if args.smoke else 1000, 0.2, wait=True)
    inflight |= fair_share(inflight, results)
    print(f"in flight, jobs of 0.2 s: {inflight}")
    parked = run_inflight(50 if args.smoke else 10_000, 2 if args.smoke else 60, wait=False)
    print(f"in flight, jobs of 60 s: {parked}")
    OUT.mkdir(exist_ok=True)
    payload = {
        "results": results,
        "ratios": overall,
        "rounds_of_ratios": each,
        "targets": targets,
        "node_latency": latency,
        "database_cost": cost,
        "inflight": inflight,
        "inflight_long_jobs": parked,
    }
    (OUT / "compare.json").write_text(json.dumps(payload, indent=2) + "\n")
    if not args.smoke:
        plot(results, OUT / "throughput.png")
        print(f"plot: {OUT / 'throughput.png'}")
    print(json.dumps(payload))


if __name__ == "__main__":
    main()
