"""The fault suite: every case records its figures; the session prints them as a table + JSON.

`make chaos` runs every case at full size (``CHAOS_SCALE=full``); `make test` runs the fast
variants, and skips the cases marked `chaos_full` (they need minutes, or restart PostgreSQL).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

FULL = os.environ.get("CHAOS_SCALE") == "full"
RESULTS = Path(__file__).resolve().parents[2] / "chaos-results.json"
_figures: dict[str, dict[str, Any]] = {}


def scale(fast: int, full: int) -> int:
    return full if FULL else fast


def record(case: str, **figures: Any) -> None:
    """Keep a case's figures for the summary (a case may record in several calls)."""
    _figures.setdefault(case, {}).update(figures)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if FULL:
        return
    skip = pytest.mark.skip(reason="full fault suite only: run `make chaos`")
    for item in items:
        if "chaos_full" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _figures:
        return
    write = terminalreporter.write_line
    write("")
    write(f"fault suite figures ({'full' if FULL else 'fast'} scale)")
    write(f"{'case':<28} {'figure':<36} value")
    for case, figures in _figures.items():
        for name, value in figures.items():
            write(f"{case:<28} {name:<36} {value}")
    payload = {"scale": "full" if FULL else "fast", "cases": _figures}
    write(json.dumps(payload))
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
