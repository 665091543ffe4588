"""Automatic recovery: every replica adopts RUNNING workflows that nobody is running.

A workflow is orphaned when its lease was released while it was RUNNING (a replica drained)
or expired (a replica died). Each sweep claims orphans through the same atomic lease acquire
as ResumeWorkflow, so two replicas never adopt the same one. Every adoption is counted; a
workflow adopted more than `max_attempts` times without progress in between is marked FAILED
("recovery attempts exhausted"), so a task that crashes its runner cannot crash-loop the fleet.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import structlog

from workflow_engine._clock import Clock, SystemClock, jittered
from workflow_engine.errors import LeaseHeld, WorkflowEngineError
from workflow_engine.storage import Pool, is_transient, workflow_rows
from workflow_engine.telemetry import Metrics

log = structlog.get_logger(__name__)


class Recoverer:
    """Periodic sweep for orphaned workflows; `recover` adopts one (see WorkflowService)."""

    def __init__(
        self,
        *,
        pool: Pool,
        recover: Callable[[str], Awaitable[bool]],
        is_live: Callable[[str], bool],
        interval_seconds: float,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._pool = pool
        self._clock = SystemClock() if clock is None else clock
        self._metrics = Metrics() if metrics is None else metrics
        self._recover = recover
        self._is_live = is_live
        self._interval = interval_seconds
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="recoverer")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def sweep(self) -> int:
        """Adopt what orphans this replica can; return how many it started running. Count,
        for the metric, the unfinished workflows a newer engine wrote (never adopted here)."""
        self._metrics.unreadable_workflows(await workflow_rows.count_unreadable(self._pool))
        adopted = 0
        for task_id in await workflow_rows.orphans(self._pool):
            if self._is_live(task_id):
                continue
            try:
                adopted += await self._recover(task_id)
            except LeaseHeld:
                continue  # another replica (or the orchestrator) got there first
            except WorkflowEngineError as exc:
                log.warning("recovery_failed", task_id=task_id, error=exc.message)
        return adopted

    async def _loop(self) -> None:
        while True:
            # Jitter keeps replicas started together from sweeping in lockstep.
            await self._clock.sleep(jittered(self._interval, random.random()))  # noqa: S311
            try:
                adopted = await self.sweep()
                if adopted:
                    log.info("recovered_workflows", count=adopted)
            except Exception as exc:
                if not is_transient(exc):
                    log.exception("recovery_sweep_error")
