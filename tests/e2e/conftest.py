"""Fixtures for tests that drive `workflow-engine serve` processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.process import EngineProcess


@pytest.fixture
def processes() -> Iterator[list[EngineProcess]]:
    """Engine processes a test started; any still alive at the end is killed."""
    started: list[EngineProcess] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            p.kill()
