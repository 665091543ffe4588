"""A clock a test sets by hand (`workflow_engine._clock.Clock`): its sleep moves it on at once."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass
class ManualClock:
    """Starts at `start` (epoch seconds) and moves only when told to, or when slept on."""

    start: float = 1_800_000_000.0  # 2027-01-15T08:00:00Z
    elapsed: float = 0.0

    def now(self) -> float:
        return self.start + self.elapsed

    def monotonic(self) -> float:
        return self.elapsed

    def advance(self, seconds: float) -> None:
        self.elapsed += seconds

    async def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
        await asyncio.sleep(0)
