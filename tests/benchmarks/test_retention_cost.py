"""`benchmarks/retention_cost.py` still runs: one small round, no figure asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def test_retention_cost_smoke() -> None:
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "retention_cost.py"),
        *("--rounds", "1", "--due", "300", "--writers", "2", "--seconds", "2"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["writes_idle"] > 0 and result["writes_pruning"] > 0
    assert result["p50_ratio"] > 0 and result["p99_ratio"] > 0
    assert "round 1/1: pruned 300 in" in done.stdout
