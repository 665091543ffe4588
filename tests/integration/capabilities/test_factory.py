"""The factory in the process: `serve` refuses an unknown choice; the engine opens and closes."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from typing import Any

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


async def test_the_engine_opens_its_capabilities_and_closes_them_when_it_stops(
    settings: Settings,
) -> None:
    journal: list[str] = []
    caps = build_capabilities(settings, LENT_NOTHING)
    replica = await start_engine(settings, replace(caps, worker=ClientWorker(journal)))
    assert journal == ["opened"]
    await stop_engine(replica)
    assert journal == ["opened", "closed"]
