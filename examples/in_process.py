"""Run a workflow in this program's own event loop, without the gRPC server.

    python examples/in_process.py

The engine is configured as `workflow-engine serve` is, from ``WORKFLOW_ENGINE_*`` variables;
with no ``WORKFLOW_ENGINE_DATABASE_URL`` it starts an embedded PostgreSQL under ``.data/`` and
stops it again on the way out. The two steps run as local jobs (the default worker). Exits 0
when the workflow succeeded.
"""

from __future__ import annotations

import asyncio
import sys

from workflow_engine import Engine, Step, TaskSpec, WorkflowEngineError, settings_from_env

TASK = TaskSpec(
    prompt="Say hello, then count the words said.",
    steps=(
        Step(id="hello", command=("echo", "hello from an in-process workflow")),
        Step(id="count", command=("sh", "-c", "echo one two three | wc -w"), depends_on=("hello",)),
    ),
)


async def main() -> int:
    async with Engine(settings_from_env()) as engine:
        handle = await engine.start(TASK)
        print(f"started workflow {handle.task_id}")
        async with asyncio.timeout(120):
            result = await handle.result()
    print(f"{result.status}: {result.summary or result.error}")
    return 0 if result.succeeded else 1


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except WorkflowEngineError as exc:  # e.g. a task the worker cannot run
        print(f"refused: {exc}", file=sys.stderr)
        sys.exit(2)
