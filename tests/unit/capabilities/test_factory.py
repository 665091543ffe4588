"""Capabilities are chosen by settings through one factory, and opened and closed around use."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from workflow_engine.capabilities import LocalSandboxWorker
from workflow_engine.capabilities._factory import Lent, build_capabilities, check_choices, opened
from workflow_engine.capabilities._static_planner import StaticPlanner
from workflow_engine.capabilities.tasks import InlineTaskSource, McpTaskSource, TaskTableSource
from workflow_engine.capabilities.workers._simulated import SimulatedWorker
from workflow_engine.config import McpSettings, Settings
from workflow_engine.domain.jobs import JobRequest, JobResult
from workflow_engine.errors import CapabilityConfigError, UnknownCapability
from workflow_engine.sandbox import JobRunner
from workflow_engine.sandbox import _wrapper as wrapper


async def no_task(task_id: str) -> dict[str, Any]:
    raise AssertionError("not read in these tests")


async def no_table() -> bool:
    raise AssertionError("not asked in these tests")


async def no_nodes() -> list[dict[str, Any]] | None:
    raise AssertionError("not read in these tests")


#: What the engine lends, for tests that never read a task or a node through it.
LENT_NOTHING = Lent(
    stored_task=no_task,
    orchestrator_task=no_task,
    has_orchestrator_tasks=no_table,
    orchestrator_nodes=no_nodes,
)


def test_the_settings_choose_each_implementation(tmp_path: Any) -> None:
    default = build_capabilities(Settings(data_dir=tmp_path), LENT_NOTHING)
    assert isinstance(default.worker, LocalSandboxWorker)
    assert isinstance(default.planner, StaticPlanner)
    simulated = build_capabilities(Settings(worker="simulated"), LENT_NOTHING)
    assert isinstance(simulated.worker, SimulatedWorker)


def test_the_task_source_setting_chooses_where_a_task_is_loaded_by_id() -> None:
    assert isinstance(build_capabilities(Settings(), LENT_NOTHING).task_source, InlineTaskSource)
    table = build_capabilities(Settings(task_source="orchestrator"), LENT_NOTHING).task_source
    assert isinstance(table, TaskTableSource)
    mcp = Settings(task_source="mcp", mcp=McpSettings(url="http://orchestrator/mcp"))
    assert isinstance(build_capabilities(mcp, LENT_NOTHING).task_source, McpTaskSource)


@pytest.mark.parametrize("setting", ["worker", "planner", "verifier", "task_source"])
def test_an_unknown_implementation_names_its_setting(setting: str) -> None:
    with pytest.raises(UnknownCapability, match=f"WORKFLOW_ENGINE_{setting.upper()}: unknown"):
        build_capabilities(Settings(**{setting: "nonesuch"}), LENT_NOTHING)


@pytest.fixture
def without_jobwrap(monkeypatch: pytest.MonkeyPatch) -> Path:
    """As an install without a C compiler leaves the package: no `jobwrap` beside jobwrap.c."""
    missing = Path("/nonexistent/jobwrap")
    monkeypatch.setattr(wrapper, "JOBWRAP", missing)
    return missing


def test_without_jobwrap_the_local_sandbox_refuses_to_start_saying_how_to_build_it(
    without_jobwrap: Path, tmp_path: Path
) -> None:
    # What `serve` (and an embedding program's `Engine.open`) checks before it starts anything.
    with pytest.raises(CapabilityConfigError) as refused:
        check_choices(Settings(data_dir=tmp_path))
    said = str(refused.value)
    assert said.startswith("WORKFLOW_ENGINE_WORKER=sandbox (the default): local jobs run only")
    assert f"{without_jobwrap} is missing or not executable" in said
    assert "`make install`" in said and "install a C compiler (cc)" in said
    # The runner itself (the local sandbox's, and a worker node's) refuses to be made.
    for make in (
        lambda: JobRunner(jobs_dir=tmp_path / "jobs"),
        lambda: LocalSandboxWorker(jobs_dir=tmp_path / "jobs"),
    ):
        with pytest.raises(CapabilityConfigError, match="jobwrap, the job wrapper"):
            make()
    assert not (tmp_path / "jobs").exists()


@pytest.mark.parametrize("worker", ["simulated", "nodes"])
def test_an_engine_whose_jobs_run_elsewhere_needs_no_jobwrap(
    without_jobwrap: Path, worker: str
) -> None:
    check_choices(Settings(worker=worker))


class ClientWorker(SimulatedWorker):
    """A worker that owns a resource, as an HTTP worker owns its client."""

    def __init__(self, journal: list[str]) -> None:
        super().__init__()
        self.journal = journal

    async def __aenter__(self) -> ClientWorker:
        self.journal.append("opened")
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.journal.append("closed")

    async def run(self, target: str, job: JobRequest) -> JobResult:
        assert self.journal == ["opened"], "used before it was opened or after it was closed"
        return await super().run(target, job)


async def test_opened_enters_and_exits_what_owns_resources() -> None:
    journal: list[str] = []
    caps = replace(build_capabilities(Settings(), LENT_NOTHING), worker=ClientWorker(journal))
    async with opened(caps):
        assert journal == ["opened"]
    assert journal == ["opened", "closed"]
