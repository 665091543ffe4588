"""`workflow-engine serve` without a database URL: the embedded PostgreSQL's lifetime.

The process that starts the embedded server stops it when it exits; one that finds a server
already running (left by a killed engine, say) reuses it and leaves it running, and its log
says how to stop it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.engine_process import EngineProcess

pytestmark = pytest.mark.e2e


def postmaster_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().splitlines()[0])


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def servers_for(pgdata: Path) -> list[int]:
    """Live postgres processes started for `pgdata` (the postmaster names it in its argv)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and str(pgdata) in cmdline:
            found.append(proc.pid)
    return found


def wait_until_gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """A data directory whose embedded server, if a test leaves one, is stopped afterwards.

    Not under pytest's `tmp_path`: every pytest session started on this machine sets pytest's
    temporary root back to mode 0700, which locks out the unprivileged user pgserver runs
    PostgreSQL as (initdb then fails), so another person's test run would break this one.
    """
    root = Path(tempfile.mkdtemp(prefix="workflow-engine-e2e-"))
    path = root / "data"
    yield path
    for pid in servers_for((path / "pgdata").resolve()):
        os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
        wait_until_gone(pid)
    shutil.rmtree(root, ignore_errors=True)


def entry(process: EngineProcess, event: str) -> dict[str, object]:
    return process.wait_for_log(event, timeout=5)


def test_serve_stops_the_embedded_postgres_it_started(
    data_dir: Path, processes: list[EngineProcess]
) -> None:
    pgdata = (data_dir / "pgdata").resolve()
    engine = EngineProcess(db_url=None, data_dir=data_dir, holder_id="embedded-1")
    processes.append(engine)
    assert entry(engine, "embedded_postgres_ready")["started"] is True
    pid = postmaster_pid(pgdata)
    assert running(pid)

    assert engine.terminate() == 0

    assert not running(pid), "the postmaster outlived the engine that started it"
    assert servers_for(pgdata) == []
    assert not (pgdata / "postmaster.pid").exists()
    assert entry(engine, "embedded_postgres_stopped")["pgdata"] == str(pgdata)


def test_a_server_found_running_is_reused_and_left_running(
    data_dir: Path, processes: list[EngineProcess]
) -> None:
    pgdata = (data_dir / "pgdata").resolve()
    crashed = EngineProcess(db_url=None, data_dir=data_dir, holder_id="embedded-2")
    processes.append(crashed)
    pid = postmaster_pid(pgdata)
    crashed.kill()  # no clean-up runs: the server stays up
    assert running(pid)

    again = EngineProcess(db_url=None, data_dir=data_dir, holder_id="embedded-3")
    processes.append(again)
    ready = entry(again, "embedded_postgres_ready")
    assert ready["started"] is False
    assert postmaster_pid(pgdata) == pid  # the same server, reused
    assert again.terminate() == 0

    assert running(pid), "an engine stopped a server it had not started"
    left = entry(again, "embedded_postgres_left_running")
    # The start-up line already says how to stop it, and so does the one at exit.
    assert ready["stop_command"] == left["stop_command"]
    subprocess.run(["/bin/sh", "-c", str(left["stop_command"])], check=True, timeout=30)
    assert wait_until_gone(pid)
    assert servers_for(pgdata) == []


def test_the_starter_leaves_the_server_to_a_process_still_using_it(
    data_dir: Path, processes: list[EngineProcess]
) -> None:
    pgdata = (data_dir / "pgdata").resolve()
    starter = EngineProcess(db_url=None, data_dir=data_dir, holder_id="embedded-4")
    processes.append(starter)
    other = EngineProcess(db_url=None, data_dir=data_dir, holder_id="embedded-5")
    processes.append(other)
    pid = postmaster_pid(pgdata)
    assert entry(other, "embedded_postgres_ready")["started"] is False

    assert starter.terminate() == 0

    assert running(pid), "the starter stopped a server another engine was using"
    assert entry(starter, "embedded_postgres_left_running")["pids"] == [other.proc.pid]
    assert other.terminate() == 0
    assert running(pid)  # found, not started, by the one that stopped last
