"""Parallel steps: independent steps run at the same time, dependents wait for them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import RunningEngine
from tests.support.helpers import new_task_id, shell_step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb


def timed(step_id: str, log: Path, seconds: float, **kw: object) -> pb.Step:
    """A step that logs when it starts and ends, around `seconds` of work."""
    return shell_step(
        step_id,
        f"echo start {step_id} $(date +%s.%N) >> {log}; sleep {seconds}; "
        f"echo end {step_id} $(date +%s.%N) >> {log}",
        **kw,
    )


def read_log(log: Path) -> dict[tuple[str, str], float]:
    entries = {}
    for line in log.read_text().splitlines():
        what, step_id, at = line.split()
        assert (what, step_id) not in entries, f"{what} {step_id} logged twice"
        entries[(what, step_id)] = float(at)
    return entries


async def run_to_end(running: RunningEngine, spec: pb.TaskSpec) -> tuple[pb.Workflow, float]:
    task_id = new_task_id()
    started = time.monotonic()
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    wf = await wait_for_status(running.stub, task_id)
    return wf, time.monotonic() - started


@pytest.mark.timing
async def test_independent_steps_overlap_and_the_dependent_waits_for_all(
    running: RunningEngine, tmp_path: Path
) -> None:
    sequential_log, parallel_log = tmp_path / "seq.log", tmp_path / "par.log"
    sequential, seq_seconds = await run_to_end(
        running, task(*(timed(s, sequential_log, 1) for s in ("a", "b", "c")))
    )
    parallel, par_seconds = await run_to_end(
        running,
        task(
            *(timed(s, parallel_log, 1) for s in ("a", "b", "c")),
            timed("report", parallel_log, 0, depends_on=["a", "b", "c"]),
        ),
    )
    assert sequential.status == pb.SUCCEEDED, sequential.error
    assert parallel.status == pb.SUCCEEDED, parallel.error

    # The same three seconds of work: side by side, well under the sequential run's time.
    assert par_seconds / seq_seconds < 0.6, (par_seconds, seq_seconds)
    log = read_log(parallel_log)
    starts = [log[("start", s)] for s in ("a", "b", "c")]
    ends = [log[("end", s)] for s in ("a", "b", "c")]
    assert max(starts) < min(ends)  # all three were running at once
    assert log[("start", "report")] >= max(ends)  # the dependent waited for every one
    state = dict(parallel.state)
    assert {sid: s["status"] for sid, s in dict(state["steps"]).items()} == {
        "a": "passed",
        "b": "passed",
        "c": "passed",
        "report": "passed",
    }
    # The dependent got its dependencies' results as context.
    assert sorted(dict(state["context"])) == ["a", "b", "c", "report"]
    assert state["current_step_index"] == 4


async def test_max_parallel_steps_bounds_how_many_run_at_once(
    running: RunningEngine, tmp_path: Path
) -> None:
    log_path = tmp_path / "bounded.log"
    wf, _ = await run_to_end(
        running,
        task(
            *(timed(s, log_path, 0.5) for s in ("a", "b", "c", "d")),
            timed("z", log_path, 0, depends_on=["a", "b", "c", "d"]),
            max_parallel_steps=2,
        ),
    )
    assert wf.status == pb.SUCCEEDED, wf.error
    log = read_log(log_path)
    events = sorted((at, what) for (what, _), at in log.items())
    running_now = peak = 0
    for _, what in events:
        running_now += 1 if what == "start" else -1
        peak = max(peak, running_now)
    assert peak == 2


async def test_each_dispatch_receives_its_dependencies_output_as_context(
    running: RunningEngine, tmp_path: Path
) -> None:
    seen = tmp_path / "context.json"
    wf, _ = await run_to_end(
        running,
        task(
            shell_step("first", "echo alpha"),
            shell_step("second", "echo beta"),
            shell_step("third", f'printf "%s" "$WORKFLOW_ENGINE_CONTEXT" > {seen}'),
        ),
    )
    assert wf.status == pb.SUCCEEDED, wf.error
    text = seen.read_text()
    assert "alpha" in text and "beta" in text
