"""`make profile`: where the engine's time goes while it runs workflows, sampled by py-spy.

By default it profiles what users run: `workflow-engine serve`, driven through gRPC, each step
the real command `true` through the default worker (compare.py's contender "engine via gRPC,
real `true`"). Once the run has warmed up, py-spy samples the engine's processes (each one
`serve` runs) for `--seconds`; then every sample is sorted by the innermost frame that belongs
to a known layer and each layer's share is printed, with how the engine's event-loop threads
spent those seconds (on a CPU, runnable but waiting for one, or asleep: Linux's schedstat). A
loop thread that is on a CPU or waiting for one nearly all the time is what bounds throughput.

`--contender "engine in-process"` profiles the in-process benchmark instead (py-spy runs it and
samples all of it; start-up is left out of the shares). `--native` adds C frames, so the time
in gRPC's Cython core gets a layer of its own rather than counting as the event loop's.

    .venv/bin/python benchmarks/profile.py [--contender NAME] [--concurrency 20]
        [--workflows 3000] [--seconds 20] [--rate 200] [--native]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_postgres import run_on_bench_postgres
from compare import contenders, measure
from contenders import engine_processes

from workflow_engine._logs import configure_logging

HERE = Path(__file__).resolve().parent
SERVED = "engine via gRPC, real `true`"
IN_PROCESS = "engine in-process"
WARM_UP_SECONDS = 5
SCHED_SECONDS = 5  # how long the event-loop threads' time is read, before sampling

# (layer, substrings of a frame's file path); the first layer found from the leaf up wins.
LAYERS = [
    (
        "checkpoint write (row checkpointer, group commit, psycopg)",
        ("checkpointer.py", "group_commit.py", "psycopg"),
    ),
    ("local jobs (job runner, its files, namespaces)", ("workflow_engine/sandbox/",)),
    ("node bodies and capabilities", ("workflow_engine/graph/_nodes/", "capabilities/")),
    ("gRPC servicer and conversions (workflow_engine/api)", ("workflow_engine/api/",)),
    ("gRPC's Cython core (with --native)", ("cygrpc", "grpc/_cython")),
    ("structlog", ("structlog",)),
    (
        "LangGraph step machinery",
        ("pregel/", "channels/", "_internal/", "langchain_core", "langgraph"),
    ),
    ("engine runtime (run, manager, leases, node wrapper)", ("workflow_engine/",)),
    ("benchmark driver", ("compare.py", "contenders.py")),
]
SETUP = ("importlib", "start_embedded_postgres", "_bootstrap")
# Frames every sample of a served engine starts with, which say nothing about where it is.
ENTRY = ("workflow_engine/cli.py", "workflow_engine/_supervisor.py", "workflow-engine:")


def layer_of(frames: list[str]) -> str | None:
    if any(marker in frame for frame in frames for marker in SETUP):
        return None
    for frame in reversed(frames):
        if any(marker in frame for marker in ENTRY):
            continue
        for name, markers in LAYERS:
            if any(marker in frame for marker in markers):
                return name
    return "event loop and other threads (select, callbacks, C code)"


def shares(folded: list[Path]) -> tuple[int, Counter[str]]:
    counts: Counter[str] = Counter()
    for path in folded:
        for line in path.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            layer = layer_of(stack.split(";"))
            if layer is not None:
                counts[layer] += int(n)
    return sum(counts.values()), counts


def py_spy(args: argparse.Namespace, output: Path, *target: str) -> list[str]:
    """py-spy's command line: record `target` (``--pid N``, or ``-- command ...``)."""
    command = [str(Path(sys.executable).with_name("py-spy")), "record", "--format", "raw"]
    command += ["--rate", str(args.rate), "--output", str(output)]
    return command + (["--native"] if args.native else []) + list(target)


def folded(tmp: Path, process: psutil.Process) -> Path:
    """Where py-spy writes `process`'s samples."""
    return tmp / f"{process.pid}.folded"


def schedstat(process: psutil.Process) -> tuple[int, int]:
    """Nanoseconds the process's main (event-loop) thread was on a CPU, and runnable waiting."""
    path = Path(f"/proc/{process.pid}/task/{process.pid}/schedstat")
    on_cpu, waiting, _ = path.read_text().split()
    return int(on_cpu), int(waiting)


async def profile_served(url: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Run the served contender and sample its engine processes once it has warmed up."""
    contender = next(c for c in contenders(tmp) if c.name == args.contender)
    run = asyncio.create_task(measure(contender, url, args.concurrency, args.workflows))
    # Serving once its client is connected (`measure` opens it; it offers no event to await).
    while getattr(contender, "channels", None) is None and not run.done():  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    await asyncio.sleep(WARM_UP_SECONDS)
    if run.done():
        run.result()  # its error, if it failed
        raise SystemExit("the run ended before sampling began: raise --workflows")
    engines = engine_processes(contender.address, contender.server_pid())
    # The threads' time before sampling: py-spy pauses the process for every sample.
    before = [schedstat(p) for p in engines]
    await asyncio.sleep(SCHED_SECONDS)
    after = [schedstat(p) for p in engines]
    samplers = [
        await asyncio.create_subprocess_exec(
            *py_spy(args, folded(tmp, p), "--pid", str(p.pid), "--duration", str(args.seconds)),
            stdout=subprocess.DEVNULL,
        )
        for p in engines
    ]
    codes = [await s.wait() for s in samplers]
    if run.done():
        raise SystemExit("the run ended while being sampled: raise --workflows")
    result = await run
    if any(codes):
        raise SystemExit(f"py-spy failed (exit {codes})")
    wall = SCHED_SECONDS * 1e9 * len(engines)
    on_cpu = sum(a[0] - b[0] for a, b in zip(after, before, strict=True)) / wall
    waiting = sum(a[1] - b[1] for a, b in zip(after, before, strict=True)) / wall
    return {
        "folded": [folded(tmp, p) for p in engines],
        "pids": [p.pid for p in engines],
        "on_cpu": on_cpu,
        "waiting": waiting,
        "result": result,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--contender",
        default=SERVED,
        help=f"a served contender of compare.py (default {SERVED!r}), or {IN_PROCESS!r}",
    )
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--workflows", type=int, default=3000)
    parser.add_argument(
        "--seconds", type=int, default=20, help="how long to sample a served engine"
    )
    parser.add_argument("--rate", type=int, default=200, help="samples per second")
    parser.add_argument("--native", action="store_true", help="sample C frames too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.contender == IN_PROCESS:
            total, counts = profile_in_process(args, Path(tmp))
        else:
            names = [c.name for c in contenders(Path(tmp)) if hasattr(c, "server_pid")]
            if args.contender not in names:
                parser.error(f"--contender: one of {', '.join(map(repr, [*names, IN_PROCESS]))}")
            configure_logging("warning")
            print(f"profiling {args.contender!r} ...", file=sys.stderr, flush=True)
            served = run_on_bench_postgres(lambda url: profile_served(url, args, Path(tmp)))
            total, counts = shares(served["folded"])
            print_served(args, served, total)
    for name, n in counts.most_common():
        print(f"  {n / total:6.1%}  {name}")


def profile_in_process(args: argparse.Namespace, tmp: Path) -> tuple[int, Counter[str]]:
    """Run the in-process contender under py-spy, which samples all of it."""
    samples = tmp / "engine.folded"
    command = [sys.executable, str(HERE / "compare.py"), "--only", IN_PROCESS]
    command += ["--concurrency", str(args.concurrency), "--workflows", str(args.workflows)]
    subprocess.run(py_spy(args, samples, "--", *command), check=True)
    total, counts = shares([samples])
    print(f"\n{total} samples while running workflows, by the innermost layer on the stack:")
    return total, counts


def print_served(args: argparse.Namespace, served: dict[str, Any], total: int) -> None:
    result, pids = served["result"], served["pids"]
    print(
        f"\n{args.contender} at concurrency {args.concurrency}: "
        f"{result['workflows_per_s']} workflows/s (sampling slows it), "
        f"{result['engine_cpu_ms_per_workflow']} ms of the engine's CPU per workflow"
    )
    asleep = 1 - served["on_cpu"] - served["waiting"]
    print(
        f"its event-loop thread{'s' if len(pids) > 1 else ''}, {SCHED_SECONDS} s before sampling"
        f" (pids {', '.join(map(str, pids))}): on a CPU {served['on_cpu']:.0%}, "
        f"runnable but waiting for a CPU {served['waiting']:.0%}, asleep {asleep:.0%}"
    )
    print(f"{total} samples of the engine, by the innermost layer on the stack:")


if __name__ == "__main__":
    main()
