"""A benchmark ended by SIGTERM or Ctrl-C stops the embedded PostgreSQL it started, and says so
in a line rather than a traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.test_embedded_postgres import (  # noqa: F401  (data_dir is a fixture)
    data_dir,
    postmaster_pid,
    running,
    wait_until_gone,
)

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
pytestmark = pytest.mark.e2e

# Stands in for a benchmark: its server up, a run under way in asyncio, as `make bench` has.
BENCHMARK = f"""
import asyncio, signal, sys
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal: not inherited ignored
sys.path.insert(0, {str(BENCHMARKS)!r})
from bench_postgres import run_on_bench_postgres

async def run(url):
    try:
        print("running", flush=True)
        await asyncio.sleep(600)
    finally:
        print("closed", flush=True)  # as a contender closes

run_on_bench_postgres(run, Path(sys.argv[1]))
"""


@pytest.mark.parametrize(
    ("sent", "status"),
    [(signal.SIGTERM, 143), (signal.SIGINT, 130)],
    ids=["SIGTERM", "Ctrl-C"],
)
def test_a_signal_stops_the_server_the_benchmark_started(
    data_dir: Path,  # noqa: F811
    sent: signal.Signals,
    status: int,
) -> None:
    pgdata = data_dir / "pgdata"
    data_dir.mkdir(parents=True)
    stderr = data_dir / "stderr"
    with stderr.open("w") as err:
        benchmark = subprocess.Popen(
            [sys.executable, "-c", BENCHMARK, str(pgdata)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        _wait_for_running(benchmark)
        server = postmaster_pid(pgdata)
        assert running(server)
        benchmark.send_signal(sent)
        assert benchmark.wait(timeout=60) == status
        assert "closed" in benchmark.stdout.read().splitlines()  # the run unwound
        assert wait_until_gone(server), "the benchmark's PostgreSQL outlived it"
        said = stderr.read_text()
        assert "Traceback" not in said
        assert ("interrupted" in said.splitlines()) == (sent == signal.SIGINT)
    finally:
        benchmark.kill()
        benchmark.wait()


def test_a_second_benchmark_waits_for_the_first(data_dir: Path) -> None:  # noqa: F811
    """Two at once would share the cores and the server, and the first to end would stop the
    server under the other: the second waits, naming the first, and runs once it has ended."""
    pgdata = data_dir / "pgdata"
    data_dir.mkdir(parents=True)
    benchmarks: list[subprocess.Popen[str]] = []
    try:
        for n in range(2):
            with (data_dir / f"stderr-{n}").open("w") as err:
                benchmarks.append(
                    subprocess.Popen(
                        [sys.executable, "-c", BENCHMARK, str(pgdata)],
                        stdout=subprocess.PIPE,
                        stderr=err,
                        text=True,
                    )
                )
            if n == 0:
                _wait_for_running(benchmarks[0])
        first, second = benchmarks
        waiting = f"waiting for the benchmark (pid {first.pid}) running on {pgdata} to end"
        assert _eventually(lambda: waiting in (data_dir / "stderr-1").read_text())
        assert second.poll() is None
        first_server = postmaster_pid(pgdata)

        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 143
        _wait_for_running(second)  # only now
        assert wait_until_gone(first_server)  # the first stopped its server before letting go
        assert running(postmaster_pid(pgdata))  # and the second started its own
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 143
    finally:
        for benchmark in benchmarks:
            benchmark.kill()
            benchmark.wait()


def _wait_for_running(benchmark: subprocess.Popen[str]) -> None:
    assert benchmark.stdout is not None
    while (line := benchmark.stdout.readline()) not in ("running\n", ""):
        pass  # its log's lines
    assert line == "running\n"


def _eventually(condition: Callable[[], bool], timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
