"""Runs the installed `workflow-engine` command as a child process, as an operator would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from tests.support.database import engine_env

ENGINE = Path(sys.executable).parent / "workflow-engine"


class EngineProcess:
    """`workflow-engine serve` on a free port; its JSON log lines are kept for the test."""

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
        self.proc = subprocess.Popen(
            [str(ENGINE), "serve"], env=env, stderr=subprocess.PIPE, text=True
        )
        self.logs: list[dict[str, object]] = []
        self._serving = threading.Event()
        self.address = ""
        threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True).start()
        if wait_serving and not self._serving.wait(60):
            self.kill()
            raise RuntimeError(f"engine did not start; logs: {self.logs[-20:]}")

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            try:
                entry = json.loads(line)
            except ValueError:
                entry = {"raw": line.rstrip()}
            self.logs.append(entry)
            if entry.get("event") == "serving":
                self.address = str(entry["address"])
                self._serving.set()

    def wait_for_raw(self, text: str, timeout: float = 30) -> None:
        """Until a line that is not the engine's JSON (a library's own log) contains `text`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in str(entry.get("raw", "")) for entry in self.logs):
                return
            time.sleep(0.05)
        raise TimeoutError(f"no {text!r} in logs: {self.logs[-10:]}")

    def count(self, event: str) -> int:
        return sum(1 for entry in self.logs if entry.get("event") == event)

    def kill(self) -> None:
        """SIGKILL: no drain, no release, nothing flushed."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def wait_for_log(self, event: str, timeout: float = 30) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for entry in self.logs:
                if entry.get("event") == event:
                    return entry
            time.sleep(0.05)
        raise TimeoutError(f"no {event!r} in logs")
