"""A benchmark ended by SIGTERM stops the embedded PostgreSQL it started, as Ctrl-C does."""

from __future__ import annotations

import signal
import subprocess
import sys
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
import asyncio, sys
from pathlib import Path
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


def test_sigterm_stops_the_server_the_benchmark_started(data_dir: Path) -> None:  # noqa: F811
    pgdata = data_dir / "pgdata"
    benchmark = subprocess.Popen(
        [sys.executable, "-c", BENCHMARK, str(pgdata)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert benchmark.stdout is not None
        while (line := benchmark.stdout.readline()) not in ("running\n", ""):
            pass  # its log's lines
        assert line == "running\n"
        server = postmaster_pid(pgdata)
        assert running(server)
        benchmark.send_signal(signal.SIGTERM)
        assert benchmark.wait(timeout=60) == 128 + signal.SIGTERM
        assert "closed" in benchmark.stdout.read().splitlines()  # the run unwound
        assert wait_until_gone(server), "the benchmark's PostgreSQL outlived it"
    finally:
        benchmark.kill()
        benchmark.wait()
