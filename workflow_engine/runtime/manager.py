"""Owns every workflow run of this process: one asyncio task per run.

It starts runs, tells a run to stop (cancel), and drains them on shutdown: every run stops at
its next node boundary with its checkpoint written and its lease released; runs still inside a
node when the drain time is up are cancelled (their node runs again on resume, and a job it had
started is re-attached by id, not run again).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from langgraph.graph.state import CompiledStateGraph

from workflow_engine.graph.commands import StateUpdate
from workflow_engine.graph.state import WorkflowState
from workflow_engine.runtime.faults import FaultPlan
from workflow_engine.runtime.run import Run
from workflow_engine.storage.leases import Fence
from workflow_engine.storage.workflows import WorkflowStore

log = structlog.get_logger(__name__)


class RunManager:
    """The live runs of this process, by task id."""

    def __init__(
        self,
        *,
        graph: CompiledStateGraph[Any, Any, Any, Any],
        store: WorkflowStore,
        faults: FaultPlan | None = None,
        on_run_end: Callable[[str], None] | None = None,
    ) -> None:
        self._on_run_end = on_run_end
        self._graph = graph
        self._store = store
        self._faults = faults
        self._runs: dict[str, tuple[Run, asyncio.Task[str]]] = {}
        self._accepting = True

    def __len__(self) -> int:
        return len(self._runs)

    def is_live(self, task_id: str) -> bool:
        return task_id in self._runs

    def get(self, task_id: str) -> Run | None:
        entry = self._runs.get(task_id)
        return entry[0] if entry else None

    @property
    def faults(self) -> FaultPlan | None:
        return self._faults

    @property
    def accepting(self) -> bool:
        return self._accepting

    def launch(
        self,
        *,
        fence: Fence,
        ttl_seconds: float,
        status: str,
        initial_input: WorkflowState | None,
        updates: Sequence[StateUpdate] = (),
    ) -> Run:
        """Start driving a workflow whose lease `fence` holds, applying `updates` first."""
        run = Run(
            fence=fence,
            ttl_seconds=ttl_seconds,
            status=status,
            graph=self._graph,
            store=self._store,
            initial_input=initial_input,
            faults=self._faults,
            updates=updates,
            on_end=self._on_run_end,
        )
        task = asyncio.create_task(run.execute(), name=f"run-{fence.task_id}")
        self._runs[fence.task_id] = (run, task)
        task.add_done_callback(lambda _: self._forget(fence.task_id, run))
        log.info("run_launched", task_id=fence.task_id, run_id=fence.run_id, epoch=fence.epoch)
        return run

    def _forget(self, task_id: str, run: Run) -> None:
        entry = self._runs.get(task_id)
        if entry is not None and entry[0] is run:
            del self._runs[task_id]

    def request_stop(self, task_id: str, reason: str) -> bool:
        entry = self._runs.get(task_id)
        if entry is None:
            return False
        entry[0].request_stop(reason)
        return True

    async def wait(self, task_id: str, seconds: float) -> bool:
        """Wait for a live run to end; True if it did (or was not running) within `seconds`."""
        entry = self._runs.get(task_id)
        if entry is None:
            return True
        done, _ = await asyncio.wait({entry[1]}, timeout=seconds)
        return bool(done)

    async def drain(self, seconds: float) -> None:
        """Stop accepting runs, stop every run at a node boundary, cancel stragglers."""
        self._accepting = False
        if not self._runs:
            return
        log.info("drain_started", runs=len(self._runs), seconds=seconds)
        for run, _ in self._runs.values():
            run.request_stop("shutdown")
        tasks = {task for _, task in self._runs.values()}
        _, pending = await asyncio.wait(tasks, timeout=seconds)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)
        log.info("drain_finished", cancelled_mid_node=len(pending))
