"""What masking a workflow's secrets costs an answer: `redact_json` over a state with many
secrets, as GetWorkflow shows it.

The state has `--steps` steps, each with `--secrets` secret env values (random, 40
characters) and a result of 2 KB of output ending with one of them, plus 200 characters of
stderr ending with a piece of one (a cut). It is masked `--repeat` times: the first builds the
matcher, the others reuse it, as a watched or polled workflow's answers do.

    .venv/bin/python benchmarks/masking.py [--steps 20] [--secrets 100]

Prints the time of the first and the median of the others, and one JSON line. Run it at a
commit before 2026-11-29 (issue 61) for the matcher it replaced. A figure, not a test.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import uuid
from typing import Any

from workflow_engine import _masking as masking


def state_with_secrets(steps: int, per_step: int) -> tuple[dict[str, Any], set[str]]:
    plan, results, values = [], {}, []
    rng = random.Random(61)  # noqa: S311 (which secret a step prints, not a secret)
    for i in range(steps):
        env = {f"S{j}": f"secret-{i}-{j}-{uuid.uuid4().hex}" for j in range(per_step)}
        values += env.values()
        plan.append({"id": f"s{i}", "command": ["sh", "-c", "x"], "env": env, "secret_env": [*env]})
        printed = rng.choice(values)
        results[f"s{i}"] = {
            "stdout": "x" * 2000 + printed,
            "stderr": "e " * 94 + printed[:12],
            "status": "passed",
            "findings": [{"check": "exit_code", "passed": True, "detail": "exit code 0"}] * 5,
        }
    return {"plan": {"steps": plan}, "steps": results}, set(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--secrets", type=int, default=100, help="per step")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    state, values = state_with_secrets(args.steps, args.secrets)
    took = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        shown = masking.redact_json(state, values)
        took.append(time.perf_counter() - started)
    assert all(v not in json.dumps(shown) for v in values)
    first, again = took[0], statistics.median(took[1:]) if len(took) > 1 else took[0]
    size = len(json.dumps(state))
    print(
        f"{len(values)} secrets, state {size} bytes: first {first * 1000:.1f} ms, "
        f"again {again * 1000:.1f} ms"
    )
    print(
        json.dumps(
            {
                "secrets": len(values),
                "state_bytes": size,
                "first_ms": first * 1000,
                "again_ms": again * 1000,
            }
        )
    )


if __name__ == "__main__":
    main()
