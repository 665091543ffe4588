"""`benchmarks/masking.py` still runs: a small state, its secrets all masked, no figure asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_masking_smoke() -> None:
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "masking.py"),
        "--steps",
        "3",
        "--secrets",
        "4",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["secrets"] == 12 and result["first_ms"] > 0 and result["again_ms"] > 0
