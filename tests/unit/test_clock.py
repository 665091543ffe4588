"""One clock: the engine's timed rules read `EngineContext.clock` (`workflow_engine._clock`),
so their calculations are tested here at instants a `ManualClock` gives, without sleeping; and
no engine module reads the system's clock itself, outside the few that are not the engine's
rules (`ALLOWED`)."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

import workflow_engine
from tests.support.clock import ManualClock
from workflow_engine._clock import SystemClock, jittered
from workflow_engine._context import EngineContext
from workflow_engine.runtime._manager import FENCE_FRESH_SECONDS, fence_fresh
from workflow_engine.runtime._retention import rest_after
from workflow_engine.runtime._run import renewal_pause
from workflow_engine.telemetry._metrics import Metrics

PACKAGE = Path(workflow_engine.__file__).parent
#: What reads the system's clock: the clock itself, and what the engine's clock does not reach
#: or need not, each with why (paths below `workflow_engine/`; a folder covers what it holds).
ALLOWED = {
    "_clock.py": "the one clock",
    # Shared with the worker node's process, which has no engine (and so no engine clock):
    # its job directories' retention, idle users and namespaces, and a job's start and end.
    "sandbox/": "the sandbox, shared with the worker node",
    "worker_node/": "the worker node, a process of its own",
    "capabilities/workers/_registry.py": "the nodes' reservations (a clock of its own)",
    "capabilities/model/_client.py": "a model call's latency, for its metric",
    "storage/_embedded.py": "how long the embedded PostgreSQL may take to start",
}
#: The system clock's readings the rule is about.
READINGS = {"time", "monotonic"}


def reads_the_clock(node: ast.AST) -> bool:
    """Whether `node` is `time.time` or `time.monotonic` (called or passed on), or imports
    either by name."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id == "time" and node.attr in READINGS
    if isinstance(node, ast.ImportFrom) and node.module == "time":
        return any(alias.name in READINGS for alias in node.names)
    return False


def readings(module: Path) -> list[int]:
    """The lines of `module` that read the system's clock (see `reads_the_clock`)."""
    tree = ast.parse(module.read_text())
    nodes = [node for node in ast.walk(tree) if isinstance(node, ast.expr | ast.stmt)]
    return sorted(node.lineno for node in nodes if reads_the_clock(node))


def allowed(relative: str) -> bool:
    return any(relative == entry or relative.startswith(entry) for entry in ALLOWED)


def test_no_engine_module_reads_the_system_clock_but_the_allowed() -> None:
    found = []
    for module in sorted(PACKAGE.rglob("*.py")):
        relative = module.relative_to(PACKAGE).as_posix()
        if relative.startswith("v1/") or allowed(relative):
            continue
        found += [f"workflow_engine/{relative}:{line}" for line in readings(module)]
    assert not found, "read the engine's clock (EngineContext.clock) instead: " + ", ".join(found)


def test_each_allowed_entry_still_reads_the_system_clock() -> None:
    """An entry nothing needs any more comes off the list (so the list stays the truth)."""
    for entry in ALLOWED:
        path = PACKAGE / entry
        modules = sorted(path.rglob("*.py")) if entry.endswith("/") else [path]
        assert any(readings(module) for module in modules), f"{entry} no longer needs to be allowed"


def test_the_guard_sees_each_way_of_reading_the_clock(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import time\nfrom time import monotonic\n"
        "a = time.time()\nb = time.monotonic\nc = time.perf_counter()\n"
    )
    assert readings(module) == [2, 3, 4]


# -- the calculations, at the instants a test gives -------------------------------------------


def test_an_engine_context_s_metrics_read_its_clock() -> None:
    clock = ManualClock()
    assert EngineContext(clock=clock).metrics.clock is clock
    assert isinstance(EngineContext().metrics.clock, SystemClock)


def test_a_workflow_s_duration_is_measured_on_the_engine_s_clock() -> None:
    clock = ManualClock()
    metrics = Metrics(clock)
    registry = metrics.enable()
    started_at = clock.now()
    clock.advance(90.0)
    metrics.workflow_finished("COMPLETED", started_at)
    observed = registry.get_sample_value(
        "gen_ai_workflow_duration_seconds_sum", {"status": "COMPLETED"}
    )
    assert observed == pytest.approx(90.0)


def test_the_last_retention_round_is_stamped_with_the_engine_s_clock() -> None:
    clock = ManualClock()
    metrics = Metrics(clock)
    registry = metrics.enable()
    clock.advance(5.0)
    metrics.retention_round_done()
    stamped = registry.get_sample_value("workflow_engine_retention_last_round_timestamp_seconds")
    assert stamped == clock.now()


def test_a_lease_is_renewed_three_times_per_time_to_live() -> None:
    assert renewal_pause(30.0) == pytest.approx(10.0)
    assert renewal_pause(0.3) == pytest.approx(0.1)


async def test_three_heartbeats_fit_in_one_time_to_live_on_a_manual_clock() -> None:
    """The heartbeat's pacing, as `Run._heartbeat` sleeps it: the third renewal is due exactly
    when the lease that the first one extended would have expired, never later."""
    clock = ManualClock()
    ttl = 30.0
    beats = []
    for _ in range(3):
        await clock.sleep(renewal_pause(ttl))
        beats.append(clock.monotonic())
    assert beats == pytest.approx([10.0, 20.0, 30.0])


def test_a_fence_confirmation_admits_jobs_for_a_moment_only() -> None:
    clock = ManualClock()
    confirmed = clock.monotonic()
    assert fence_fresh(confirmed, clock.monotonic())
    clock.advance(FENCE_FRESH_SECONDS * 0.9)
    assert fence_fresh(confirmed, clock.monotonic())
    clock.advance(FENCE_FRESH_SECONDS * 0.1)
    assert not fence_fresh(confirmed, clock.monotonic())
    assert not fence_fresh(None, clock.monotonic())  # never confirmed: check with the database


def test_the_pruner_rests_nine_times_its_last_batch_and_a_little_at_least() -> None:
    clock = ManualClock()
    started = clock.monotonic()
    clock.advance(0.1)  # the batch took a tenth of a second
    assert rest_after(clock.monotonic() - started) == pytest.approx(0.9)
    assert rest_after(0.0) == pytest.approx(0.02)


@pytest.mark.parametrize("draw", [0.0, 0.25, 0.999999])
def test_a_background_loop_pauses_between_half_and_all_of_its_interval(draw: float) -> None:
    pause = jittered(10.0, draw)
    assert 5.0 <= pause < 10.0
    assert pause == pytest.approx(5.0 + 5.0 * draw)


async def test_recovery_sweeps_are_paced_on_the_engine_s_clock() -> None:
    """Ten sweeps' pauses, on a manual clock: between five and ten intervals in all, and no
    real time passes."""
    clock = ManualClock()
    draws = random.Random(52)
    for _ in range(10):
        await clock.sleep(jittered(2.0, draws.random()))
    assert 10.0 <= clock.monotonic() < 20.0
