"""A benchmark that is killed leaves no engine or worker node behind: what it starts through
`contenders.ended_with_us` gets SIGTERM when the benchmark's process dies, even by SIGKILL."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

# Stands in for `make bench`: starts a long-lived child the way the benchmark starts an engine,
# prints its pid, then waits to be killed.
BENCHMARK = f"""
import subprocess, sys, time
sys.path.insert(0, {str(BENCHMARKS)!r})
from contenders import ended_with_us
child = subprocess.Popen(ended_with_us(sys.executable, "-c", "import time; time.sleep(600)"))
print(child.pid, flush=True)
time.sleep(600)
"""


def running(pid: int) -> bool:
    """Whether `pid` still runs (a zombie nobody reaped has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs util-linux setpriv")
def test_what_the_benchmark_started_ends_when_the_benchmark_is_killed() -> None:
    benchmark = subprocess.Popen(
        [sys.executable, "-c", BENCHMARK], stdout=subprocess.PIPE, text=True
    )
    assert benchmark.stdout is not None
    child = int(benchmark.stdout.readline())
    try:
        assert running(child)
        benchmark.kill()  # SIGKILL: no handler, no cleanup of its own runs
        benchmark.wait()
        deadline = time.monotonic() + 10
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(child), "the child outlived the killed benchmark"
    finally:
        benchmark.kill()
        benchmark.wait()
        if running(child):
            os.kill(child, signal.SIGKILL)
