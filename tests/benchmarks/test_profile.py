"""`make profile` samples the served engine's own processes and reads their loop threads' time."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("contender", ["engine via gRPC, real `true`, 2 processes"])
def test_profile_samples_the_engine_processes(contender: str) -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "profile.py"), "--contender", contender]
    command += ["--concurrency", "10", "--workflows", "2000", "--seconds", "2", "--rate", "100"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    # Both engine processes `serve` supervises, not the supervisor (which runs no workflow).
    pids = re.search(r"event-loop threads, 5 s before sampling \(pids (\d+), (\d+)\)", out)
    assert pids, out
    times = re.search(
        r"on a CPU (\d+)%, runnable but waiting for a CPU (\d+)%, asleep (-?\d+)%", out
    )
    assert times, out
    on_cpu, waiting, asleep = map(int, times.groups())
    assert on_cpu > 0 and waiting >= 0 and asleep >= 0
    assert abs(on_cpu + waiting + asleep - 100) <= 2
    samples = int(re.search(r"(\d+) samples of the engine", out).group(1))  # type: ignore[union-attr]
    assert samples > 0
    shares = dict(
        (name, float(share))
        for share, name in re.findall(r"^\s+([\d.]+)%  (.+)$", out, flags=re.MULTILINE)
    )
    # What only the engine's processes do: write checkpoints and run the jobs.
    assert shares.get("checkpoint write (row checkpointer, group commit, psycopg)", 0) > 0, out
    assert shares.get("local jobs (job runner, its files, namespaces)", 0) > 0, out
    assert abs(sum(shares.values()) - 100) < 1


def test_profile_refuses_a_contender_it_cannot_attach_to() -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "profile.py"), "--contender", "DBOS"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--contender: one of 'engine via gRPC'" in done.stderr


def test_a_served_engines_entry_frames_name_no_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sample of `serve` starts in the CLI: the loop's own time is not the runtime's."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # profile.py imports its siblings
    spec = importlib.util.spec_from_file_location("profile_script", ROOT / "benchmarks/profile.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    entry = ["<module> (workflow-engine:6)", "main (workflow_engine/cli.py:152)"]
    loop = [*entry, "run (asyncio/runners.py:190)", "Handle._run (asyncio/events.py:80)"]
    assert script.layer_of(loop) == "event loop and other threads (select, callbacks, C code)"
    run = [*loop, "Run.execute (workflow_engine/runtime/_run.py:225)"]
    assert script.layer_of(run) == "engine runtime (run, manager, leases, node wrapper)"
