"""`make profile`: where the in-process engine's CPU goes, sampled by py-spy.

Runs `compare.py --only "engine in-process"` under `py-spy record`, then sorts every sample by
the innermost frame that belongs to a known layer and prints each layer's share. Startup
(imports, the embedded server, creating databases) is left out of the shares.

    .venv/bin/python benchmarks/profile.py [--concurrency 20] [--workflows 1000] [--rate 250]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent

# (layer, substrings of a frame's file path); the first layer found from the leaf up wins.
LAYERS = [
    (
        "checkpoint write (row checkpointer, group commit, psycopg)",
        ("checkpointer.py", "group_commit.py", "psycopg"),
    ),
    ("node bodies and capabilities", ("workflow_engine/graph/nodes.py", "capabilities/")),
    ("structlog", ("structlog",)),
    (
        "LangGraph step machinery",
        ("pregel/", "channels/", "_internal/", "langchain_core", "langgraph"),
    ),
    ("engine runtime (run, manager, leases, node wrapper)", ("workflow_engine/",)),
    ("benchmark driver", ("compare.py", "contenders.py")),
]
SETUP = ("importlib", "start_embedded_postgres", "_bootstrap")


def layer_of(frames: list[str]) -> str | None:
    if any(marker in frame for frame in frames for marker in SETUP):
        return None
    for frame in reversed(frames):
        for name, markers in LAYERS:
            if any(marker in frame for marker in markers):
                return name
    return "event loop (select, callbacks)"


def shares(folded: Path) -> tuple[int, Counter[str]]:
    counts: Counter[str] = Counter()
    for line in folded.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        layer = layer_of(stack.split(";"))
        if layer is not None:
            counts[layer] += int(n)
    return sum(counts.values()), counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folded = Path(tmp) / "engine.folded"
        subprocess.run(
            [
                str(Path(sys.executable).with_name("py-spy")),
                "record", "--format", "raw", "--rate", str(args.rate), "--output", str(folded),
                "--", sys.executable, str(HERE / "compare.py"),
                "--concurrency", str(args.concurrency), "--workflows", str(args.workflows),
                "--only", "engine in-process",
            ],
            check=True,
        )  # fmt: skip
        total, counts = shares(folded)
    print(f"\n{total} samples while running workflows, by the innermost layer on the stack:")
    for name, n in counts.most_common():
        print(f"  {n / total:6.1%}  {name}")


if __name__ == "__main__":
    main()
