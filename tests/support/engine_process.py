"""Runs the installed `workflow-engine serve` as a child process, as an operator would."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.database import engine_env
from tests.support.processes import COMMAND, ChildProcess, killed_after

ENGINE = COMMAND


class EngineProcess(ChildProcess):
    """`workflow-engine serve` on a free port; its JSON log lines are kept for the test."""

    name = "engine"

    def __init__(
        self,
        *,
        db_url: str | None,
        data_dir: Path,
        holder_id: str,
        ttl: int = 30,
        recovery: bool = True,
        faults: str = "",
        extra_env: dict[str, str] | None = None,
        wait_serving: bool = True,
    ) -> None:
        super().__init__()
        env = {
            **os.environ,
            # None: no URL at all, so the engine starts (or finds) its embedded server.
            "WORKFLOW_ENGINE_DATABASE_URL": db_url or "",
            "WORKFLOW_ENGINE_DATA_DIR": str(data_dir),
            "WORKFLOW_ENGINE_LISTEN": "127.0.0.1:0",
            "WORKFLOW_ENGINE_HOLDER_ID": holder_id,
            "WORKFLOW_ENGINE_LEASE_TTL_SECONDS": str(ttl),
            "WORKFLOW_ENGINE_RECOVERY_ENABLED": "true" if recovery else "false",
            "WORKFLOW_ENGINE_RECOVERY_INTERVAL_SECONDS": "0.5",
            "WORKFLOW_ENGINE_FAULTS": faults,
            # One engine process, as these tests expect (see tests/e2e/test_processes.py).
            "WORKFLOW_ENGINE_PROCESSES": "1",
            **(engine_env(db_url) if db_url else {}),
            **(extra_env or {}),
        }
        self._spawn([str(ENGINE), "serve"], env)
        if wait_serving and not self._serving.wait(60):
            self.kill()
            raise RuntimeError(f"engine did not start; logs: {self.logs[-20:]}")


@pytest.fixture(name="processes")
def processes_fixture() -> Iterator[list[EngineProcess]]:
    """Engine processes a test started; any still alive at the end is killed."""
    yield from killed_after([])
