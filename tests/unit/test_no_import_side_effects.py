"""Importing the engine changes nothing process-wide: JSON adapters are set per connection."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import psycopg
from psycopg.types import json
def state():
    return (json._JsonDumper._dumps, json._JsonLoader._loads,
            psycopg.adapters.get_dumper(json.Jsonb, json.PyFormat.BINARY))
before = state()
import workflow_engine.engine, workflow_engine.cli  # noqa: F401
assert state() == before, (before, state())
print("unchanged")
"""


def test_importing_the_engine_leaves_psycopgs_global_adapters_alone() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=False, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == "unchanged", out.stderr[-2000:]
