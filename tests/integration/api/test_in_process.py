"""The public in-process API: `Engine` in the caller's event loop, a `TaskSpec` started and
awaited without gRPC, and the example in `examples/` run as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.database import engine_env
from workflow_engine import (
    Engine,
    InvalidArgument,
    Settings,
    Step,
    TaskSpec,
    WorkflowExists,
    WorkflowStatus,
)

REPOSITORY = Path(__file__).resolve().parents[3]
EXAMPLE = REPOSITORY / "examples" / "in_process.py"


def echo(*words: str) -> TaskSpec:
    return TaskSpec(steps=(Step(id="echo", command=("echo", *words)),))


async def test_a_workflow_runs_to_its_result(settings: Settings) -> None:
    async with Engine(settings) as engine:
        result = await engine.run(echo("hello"))
        record = await engine.workflow(result.task_id).record()
    assert result.status == WorkflowStatus.SUCCEEDED and result.succeeded and result.ended
    assert result.record.task_id == result.task_id == record.task_id
    assert record.status == WorkflowStatus.SUCCEEDED
    assert result.error == ""


async def test_a_failed_step_is_a_failed_result_not_an_exception(settings: Settings) -> None:
    task = TaskSpec(steps=(Step(id="no", command=("false",)),), max_attempts_per_step=1)
    async with Engine(settings) as engine:
        result = await engine.run(task)
    assert result.status == WorkflowStatus.FAILED and not result.succeeded, result
    assert result.error, result


async def test_a_start_answers_as_over_grpc(settings: Settings) -> None:
    key = str(uuid.uuid4())
    async with Engine(settings) as engine:
        with pytest.raises(InvalidArgument, match="idempotency_key: not a UUID"):
            await engine.start(echo("once"), idempotency_key="key-1")
        first = await engine.start(echo("once"), idempotency_key=key)
        assert first.started is not None and first.started.status == "STARTED"
        await first.wait()
        again = await engine.start(echo("once"), task_id=first.task_id, idempotency_key=key)
        assert again.started is not None and again.started.status == "ALREADY_FINISHED"
        with pytest.raises(WorkflowExists):
            await engine.start(echo("twice"), task_id=first.task_id)
        assert (await again.result()).succeeded


async def test_an_engine_is_used_open_only(settings: Settings) -> None:
    engine = Engine(settings)
    with pytest.raises(RuntimeError, match="not open"):
        await engine.start(echo("early"))
    async with engine:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        await engine.start(echo("late"))
    with pytest.raises(RuntimeError, match="opened already"):
        await engine.open()


def test_the_example_starts_and_awaits_a_workflow(db_url: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPOSITORY),
        "WORKFLOW_ENGINE_DATABASE_URL": db_url,
        "WORKFLOW_ENGINE_DATA_DIR": str(tmp_path / "data"),
        "WORKFLOW_ENGINE_LOG_LEVEL": "warning",
        **engine_env(db_url),
    }
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    assert "started workflow " in done.stdout
    assert "SUCCEEDED" in done.stdout, done.stdout
