"""The timer sweeps' loop on a clock set by hand: a failing round does not end it, each pause
is half to all of the interval, and `close` stops it."""

from __future__ import annotations

import asyncio

from tests.support.clock import ManualClock
from workflow_engine.runtime._periodic import Periodic


async def test_a_failing_round_does_not_end_the_loop() -> None:
    clock = ManualClock()
    rounds: list[float] = []

    async def round() -> None:
        rounds.append(clock.monotonic())
        if len(rounds) == 1:
            raise RuntimeError("the first round fails")

    loop = Periodic("test_loop", round, clock=clock, interval_seconds=10)
    loop.start()
    for _ in range(50):
        await asyncio.sleep(0)
        if len(rounds) >= 3:
            break
    await loop.close()
    assert len(rounds) >= 3  # the loop went on after the first round raised
    gaps = [b - a for a, b in zip([0.0, *rounds], rounds, strict=False)]
    assert all(5 <= gap <= 10 for gap in gaps), gaps
    stopped = len(rounds)
    for _ in range(10):
        await asyncio.sleep(0)
    assert len(rounds) == stopped  # closed: no round after
