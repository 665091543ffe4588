"""Fixtures for tests that drive `workflow-engine serve` processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.process import EngineProcess
from tests.support.model_server import ModelServer


@pytest.fixture
def processes() -> Iterator[list[EngineProcess]]:
    """Engine processes a test started; any still alive at the end is killed."""
    started: list[EngineProcess] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            p.kill()


@pytest.fixture
def model() -> Iterator[ModelServer]:
    """A model server speaking the Chat Completions API (see `tests.support.model_server`); every
    request it refused fails the test."""
    server = ModelServer()
    yield server
    server.stop()
    assert server.problems == []
