"""The model tests: the engine against a real model server (`tests.support.llama_server`).

They need the model's own environment, which ``make test-model`` builds (llama-cpp-python
compiles llama.cpp for about 8 minutes the first time), so ``make test`` skips them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.engine_process import processes_fixture  # noqa: F401 (a fixture)
from tests.support.llama_server import SERVERS, LlamaCppServer, LlamaServer

ENABLED = os.environ.get("WORKFLOW_ENGINE_TEST_MODEL") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="a real model server: run `make test-model`")
    for item in items:
        if "tests/model/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session", params=sorted(SERVERS))
def llama(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer | LlamaCppServer]:
    """A real server with SmolLM2-135M-Instruct, each of them in turn: llama-cpp-python's
    (json_object with a schema) and llama.cpp's (json_schema)."""
    log = tmp_path_factory.mktemp("llama") / "server.log"
    server = SERVERS[request.param](log=log)
    yield server
    server.stop()


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    """Every command a model plans runs (in the local sandbox, as a job's user): these tests
    are about the model's answers, not the policy (`tests/security/test_command_policy.py`)."""
    path = tmp_path / "policy.yaml"
    path.write_text("allow: [sh, echo, cat, printf, ls, touch, mkdir]\ndefault: allow\n")
    return path
