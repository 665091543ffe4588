"""The one clock every timed rule reads: lease renewal, deadlines, approval expiry, schedules
and retention.

The engine builds one (`EngineContext.clock`) and hands it down; a calculation takes the time
as an argument (`now`) instead of reading it, so a unit test passes the instant it wants and
never sleeps. Leases are the exception that proves the rule: their expiry is compared on the
database's clock (`storage.leases`), the one clock every replica shares; this clock only paces
their renewal.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Wall time for what is stored or compared across processes, monotonic time for
    intervals within one, and a sleep that a test's clock may make instant."""

    def now(self) -> float:
        """Seconds since the Unix epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary start, never going back."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` of this clock's time."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def jittered(seconds: float, draw: float) -> float:
    """A background loop's pause: between half of `seconds` and all of it, as `draw` (in [0,
    1), e.g. `random.random()`) goes, so replicas started together do not act in lockstep."""
    return seconds * (0.5 + 0.5 * draw)


__all__ = ["Clock", "SystemClock", "jittered"]
