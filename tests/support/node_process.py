"""Runs `workflow-engine worker-node` as a child process, as an operator would.

`NodeProcess` starts a node on a free port (or a given address) with its own data directory
and token, keeps its JSON log lines, and can kill -9 it, SIGTERM it, or start it again on the
same address and data directory (`restart`), so a test can check what survives. Tests of the
engine's side use it too: the node's `url` and `token` are what a nodes file names.
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.processes import COMMAND, ChildProcess, killed_after

NODE_COMMAND = COMMAND
TOKEN_VARIABLE = "WORKFLOW_ENGINE_NODE_TOKEN"


class NodeProcess(ChildProcess):
    """`workflow-engine worker-node` on a free port, its log lines kept for the test."""

    name = "node"

    def __init__(
        self,
        *,
        data_dir: Path,
        token: str = "node-token",
        listen: str = "127.0.0.1:0",
        args: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.token = token
        self.args = args
        self.extra_env = dict(extra_env or {})
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
        self._spawn(command, env)
        deadline = time.monotonic() + 30
        while not self._serving.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                time.sleep(0.1)  # the reader thread takes the last lines
                raise RuntimeError(
                    f"worker node did not start (exit {self.proc.returncode}); "
                    f"logs: {self.logs[-20:]}"
                )

    def _served(self, entry: dict[str, object]) -> None:
        self._url = str(entry.get("url") or "")

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM (the node drains), then its exit status."""
        return super().terminate(timeout)

    def restart(self) -> None:
        """Start the node again on the same address and data directory (stopped first if not)."""
        if self.alive():
            self.kill()
        self._start(self.address)


_ROOT = Path(__file__).resolve().parents[2]


# Fixtures for the tests that drive one node of their own (import them into the test module).


@pytest.fixture
def nodes() -> Iterator[list[NodeProcess]]:
    """Node processes a test started; any still alive at the end is killed."""
    yield from killed_after([])


@pytest.fixture
def node(nodes: list[NodeProcess], tmp_path: Path) -> NodeProcess:
    nodes.append(NodeProcess(data_dir=tmp_path / "node"))
    return nodes[-1]


@pytest.fixture
async def client(node: NodeProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(headers=node.headers, timeout=60) as c:
        yield c
