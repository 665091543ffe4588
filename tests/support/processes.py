"""The `workflow-engine` command as a child process, as an operator would run it.

`ChildProcess` is what an engine (`engine_process`) and a worker node (`node_process`) share:
the command, its JSON log lines on stderr kept for the test (and its ``serving`` line's
address), waiting for a line, and stopping it with SIGKILL or SIGTERM. `killed_after` is the
body of the fixtures that hand a test a list to start processes into.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TypeVar

#: The installed command, beside the tests' interpreter.
COMMAND = Path(sys.executable).parent / "workflow-engine"


class ChildProcess:
    """A `workflow-engine` subcommand running as a child; its log lines kept in `logs`."""

    #: What the process is, in messages.
    name = "process"

    def __init__(self) -> None:
        self.logs: list[dict[str, object]] = []
        self.address = ""

    def _spawn(self, command: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
        self._serving = threading.Event()
        threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True).start()

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
                self._served(entry)
                self._serving.set()

    def _served(self, entry: dict[str, object]) -> None:
        """What else a subclass keeps of its ``serving`` line."""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def count(self, event: str) -> int:
        return sum(1 for entry in self.logs if entry.get("event") == event)

    def kill(self) -> None:
        """SIGKILL: no drain, nothing flushed; the jobs' own processes are not signalled."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM (it drains), then its exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def wait_for_log(self, event: str, timeout: float = 30) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for entry in list(self.logs):
                if entry.get("event") == event:
                    return entry
            time.sleep(0.05)
        raise TimeoutError(f"no {event!r} in the {self.name}'s logs: {self.logs[-10:]}")

    def wait_for_raw(self, text: str, timeout: float = 30) -> None:
        """Until a line that is not the process's JSON (a library's own log) contains `text`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in str(entry.get("raw", "")) for entry in list(self.logs)):
                return
            time.sleep(0.05)
        raise TimeoutError(f"no {text!r} in the {self.name}'s logs: {self.logs[-10:]}")


P = TypeVar("P", bound=ChildProcess)


def killed_after(started: list[P]) -> Iterator[list[P]]:
    """A fixture's body: the test starts processes into `started`; any still alive after it
    is killed."""
    yield started
    for process in started:
        process.kill()
