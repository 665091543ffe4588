"""How long the server leaves a health check waiting while an attack runs: the event loop it
shares with every run and lease renewal is free when a check is answered at once."""

from __future__ import annotations

import asyncio
import time
from types import TracebackType

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


class HealthWatch:
    """Asks for health every `every` seconds while inside `async with`. `worst` is the longest
    a check waited, counted from when it was due, so a stall that begins between two checks
    counts as much as one that catches a check in flight."""

    def __init__(self, channel: grpc.aio.Channel, every: float = 0.02) -> None:
        self._health = health_pb2_grpc.HealthStub(channel)
        self._every = every
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.worst = 0.0
        self.checks = 0

    async def __aenter__(self) -> HealthWatch:
        await self._check()  # the channel is connected before anything is timed
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def _check(self) -> None:
        await self._health.Check(health_pb2.HealthCheckRequest(), timeout=60)

    async def _poll(self) -> None:
        due = time.perf_counter()
        while not self._stop.is_set() or self.checks < 3:
            await self._check()
            answered = time.perf_counter()
            self.worst = max(self.worst, answered - due)
            self.checks += 1
            due = answered + self._every
            await asyncio.sleep(self._every)
