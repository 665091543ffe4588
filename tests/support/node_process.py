"""Runs `workflow-engine worker-node` as a child process, as an operator would.

`NodeProcess` starts a node on a free port (or a given address) with its own data directory
and token, keeps its JSON log lines, and can kill -9 it, SIGTERM it, or start it again on the
same address and data directory (`restart`), so a test can check what survives. Tests of the
engine's side use it too: the node's `url` and `token` are what a nodes file names.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO

import httpx
import pytest

NODE_COMMAND = Path(sys.executable).parent / "workflow-engine"
TOKEN_VARIABLE = "WORKFLOW_ENGINE_NODE_TOKEN"


class NodeProcess:
    """`workflow-engine worker-node` on a free port, its log lines kept for the test."""

    def __init__(
        self,
        *,
        data_dir: Path,
        token: str = "node-token",
        listen: str = "127.0.0.1:0",
        args: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.token = token
        self.args = args
        self.extra_env = dict(extra_env or {})
        self.logs: list[dict[str, object]] = []
        self.address = ""
        self._url = ""
        self._start(listen)

    @property
    def url(self) -> str:
        """Its base URL as its `serving` line gives it (``https://`` when it serves TLS)."""
        return self._url or f"http://{self.address}"

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @property
    def headers(self) -> dict[str, str]:
        """What a request needs to be let in."""
        return {"Authorization": f"Bearer {self.token}"}

    def _start(self, listen: str) -> None:
        env = {
            **os.environ,
            TOKEN_VARIABLE: self.token,
            # The package the tests import, also when it is not the one installed (a worktree).
            "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
            **self.extra_env,
        }
        command = [
            str(NODE_COMMAND),
            "worker-node",
            "--listen",
            listen,
            "--data-dir",
            str(self.data_dir),
            *self.args,
        ]
        self.proc = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
        self._serving = threading.Event()
        threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True).start()
        deadline = time.monotonic() + 30
        while not self._serving.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                time.sleep(0.1)  # the reader thread takes the last lines
                raise RuntimeError(
                    f"worker node did not start (exit {self.proc.returncode}); "
                    f"logs: {self.logs[-20:]}"
                )

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
                self._url = str(entry.get("url") or "")
                self._serving.set()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def count(self, event: str) -> int:
        return sum(1 for entry in self.logs if entry.get("event") == event)

    def kill(self) -> None:
        """SIGKILL: no drain, nothing flushed; the jobs' own processes are not signalled."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM (the node drains), then its exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def restart(self) -> None:
        """Start the node again on the same address and data directory (stopped first if not)."""
        if self.alive():
            self.kill()
        self._start(self.address)

    def wait_for_log(self, event: str, timeout: float = 30) -> dict[str, object]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for entry in list(self.logs):
                if entry.get("event") == event:
                    return entry
            time.sleep(0.05)
        raise TimeoutError(f"no {event!r} in the node's logs: {self.logs[-10:]}")


_ROOT = Path(__file__).resolve().parent.parent


# Fixtures for the tests that drive one node of their own (import them into the test module).


@pytest.fixture
def nodes() -> Iterator[list[NodeProcess]]:
    """Node processes a test started; any still alive at the end is killed."""
    started: list[NodeProcess] = []
    yield started
    for node in started:
        node.kill()


@pytest.fixture
def node(nodes: list[NodeProcess], tmp_path: Path) -> NodeProcess:
    nodes.append(NodeProcess(data_dir=tmp_path / "node"))
    return nodes[-1]


@pytest.fixture
async def client(node: NodeProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(headers=node.headers, timeout=60) as c:
        yield c
