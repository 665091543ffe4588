"""Readiness: whether this engine can do its work now, for its health status.

Health says SERVING only while the engine could run a workflow: its database answers and its
data directory (where the local sandbox keeps job directories) takes a file. Every few
seconds this writes and removes a probe file in the data directory and asks the database for
`SELECT 1`; the first failure turns health NOT_SERVING (a load balancer or Kubernetes then
sends calls elsewhere), the first success after it SERVING again. Each change is logged.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import structlog
from psycopg_pool import AsyncConnectionPool

log = structlog.get_logger(__name__)

#: The longest one check may take before it counts as failed.
CHECK_TIMEOUT_SECONDS = 5.0


class Readiness:
    """Checks the database and the data directory every `interval_seconds`; tells
    `on_change(ready, why)` when readiness changes (see the module docstring)."""

    def __init__(
        self,
        *,
        pool: AsyncConnectionPool[Any],
        data_dir: Path,
        interval_seconds: float,
        on_change: Callable[[bool, str], Any],
    ) -> None:
        self._pool = pool
        self._data_dir = data_dir
        self._interval = interval_seconds
        self._on_change = on_change
        self._ready = True  # the engine just started: both worked a moment ago
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="readiness")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def check(self) -> str:
        """Why the engine cannot work now ("" when it can)."""
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
                await asyncio.to_thread(self._touch)
        except (OSError, TimeoutError) as exc:
            return f"data directory {str(self._data_dir)!r} is not writable: {exc}"
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_SECONDS):
                async with self._pool.connection(timeout=CHECK_TIMEOUT_SECONDS) as conn:
                    await conn.execute("SELECT 1")
        except (psycopg.Error, TimeoutError, OSError) as exc:
            return f"the database does not answer: {type(exc).__name__}: {exc}"
        return ""

    def _touch(self) -> None:
        self._data_dir.mkdir(parents=True, exist_ok=True)  # e.g. a fresh, empty volume
        probe = self._data_dir / f".ready-{uuid.uuid4().hex}"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"ok")
        finally:
            os.close(fd)
            probe.unlink(missing_ok=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            why = await self.check()
            ready = not why
            if ready != self._ready:
                self._ready = ready
                if ready:
                    log.info("engine_ready")
                else:
                    log.warning("engine_not_ready", reason=why)
                await self._on_change(ready, why)
