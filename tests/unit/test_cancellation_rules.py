"""Two ways Python 3.11 loses a task's cancellation, kept out of the engine's code.

A cancellation that is lost leaves a loop running that `close` waits for forever (CI hung on
one). `asyncio.wait_for` returns the inner result when the outer task is cancelled in the
moment the inner one ends (fixed in 3.12; `asyncio.timeout` has no such window), and
psycopg_pool's own pool does the same inside `getconn` (psycopg#1345; `EnginePool` does not,
tests/integration/storage/test_pool_cancellation.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import workflow_engine

PACKAGE = Path(workflow_engine.__file__).parent


def _calls(name: str) -> list[str]:
    """Where the engine's modules call `<anything>.name(...)` or `name(...)`, as path:line."""
    found = []
    for module in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = node.func
            if (isinstance(called, ast.Attribute) and called.attr == name) or (
                isinstance(called, ast.Name) and called.id == name
            ):
                found.append(f"{module.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_no_asyncio_wait_for() -> None:
    assert _calls("wait_for") == [], "use `async with asyncio.timeout(...)` instead"


def test_the_engine_makes_its_pools_as_engine_pools() -> None:
    assert _calls("AsyncConnectionPool") == [], "use storage.pool.EnginePool"
