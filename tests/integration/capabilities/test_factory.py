"""The factory in the process: `serve` refuses an unknown choice, and a local sandbox without
`jobwrap` (as `worker-node` does); the engine opens and closes its capabilities."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import start_engine, stop_engine
from tests.unit.capabilities.test_factory import LENT_NOTHING, ClientWorker
from workflow_engine.capabilities import build_capabilities
from workflow_engine.config import Settings


def test_serve_refuses_an_unknown_implementation_with_the_setting_named(tmp_path: Any) -> None:
    """Before it starts anything: no database is started for a configuration that cannot run."""
    out = subprocess.run(
        [sys.executable, "-m", "workflow_engine.cli", "serve"],
        env={
            "WORKFLOW_ENGINE_PLANNER": "oracle",
            "WORKFLOW_ENGINE_DATA_DIR": str(tmp_path),
            "PATH": "/usr/bin:/bin",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert "WORKFLOW_ENGINE_PLANNER: unknown planner 'oracle'" in out.stderr
    assert not (tmp_path / "pgdata").exists()


#: The command line, in a process whose package has no `jobwrap` (as an install without a C
#: compiler leaves it): the module's path is moved before anything looks at it.
WITHOUT_JOBWRAP = (
    "import sys; from pathlib import Path; from workflow_engine.sandbox import _wrapper; "
    "_wrapper.JOBWRAP = Path('/nonexistent/jobwrap'); from workflow_engine.cli import main; "
    "sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize("command", ["serve", "worker-node"])
def test_serve_and_worker_node_refuse_to_start_without_jobwrap(
    tmp_path: Path, command: str
) -> None:
    """At once, saying how to build it: no database is started, no data directory locked."""
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_JOBWRAP, command, "--data-dir", str(tmp_path / "data")],
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "WORKFLOW_ENGINE_NODE_TOKEN": "node-token",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert "/nonexistent/jobwrap is missing or not executable" in out.stderr
    assert "Build it with `make install`" in out.stderr
    assert ("WORKFLOW_ENGINE_WORKER=sandbox" in out.stderr) == (command == "serve")
    assert not (tmp_path / "data").exists()


async def test_the_engine_opens_its_capabilities_and_closes_them_when_it_stops(
    settings: Settings,
) -> None:
    journal: list[str] = []
    caps = build_capabilities(settings, LENT_NOTHING)
    replica = await start_engine(settings, replace(caps, worker=ClientWorker(journal)))
    assert journal == ["opened"]
    await stop_engine(replica)
    assert journal == ["opened", "closed"]
