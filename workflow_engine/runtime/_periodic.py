"""A background round, every interval of the engine's clock: the timer sweeps' one loop.

Each pause is `clock.jittered` (half to all of the interval), so replicas started together do
not act in lockstep; a round that fails is logged (a transient database error quietly: the
next round tries again) and never ends the loop. `close` cancels it. Recovery and retention
keep loops of their own: each logs what its rounds did.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from workflow_engine._clock import Clock, jittered
from workflow_engine.storage import is_transient

log = structlog.get_logger(__name__)


class Periodic:
    """Calls `round` every `interval_seconds` (jittered) of `clock` between `start` and
    `close`; `name` names the task and the log event of a failed round."""

    def __init__(
        self,
        name: str,
        round: Callable[[], Awaitable[Any]],
        *,
        clock: Clock,
        interval_seconds: float,
    ) -> None:
        self._name = name
        self._round = round
        self._clock = clock
        self._interval = interval_seconds
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=self._name)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await self._clock.sleep(jittered(self._interval, random.random()))  # noqa: S311
            try:
                await self._round()
            except Exception as exc:
                if not is_transient(exc):
                    log.exception("periodic_round_failed", loop=self._name)
