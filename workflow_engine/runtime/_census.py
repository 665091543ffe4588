"""The engine's census of what it holds in memory (`domain.held`), gathered from its parts.

`Engine.held` takes it on demand (the leak tests count with it); with metrics on, a loop sets
``workflow_engine_held_entries{structure}`` from it every `interval_seconds`, so operators
can graph each structure over months and see one grow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from workflow_engine._clock import Clock
from workflow_engine._masking import MAX_REMEMBERED, Secrets
from workflow_engine.domain.held import Held
from workflow_engine.runtime._periodic import Periodic
from workflow_engine.telemetry import Metrics

#: A part that tells what it holds.
Source = Callable[[], Iterable[Held]]


def remembered(secrets: Secrets) -> Source:
    """The secrets' forms an engine remembers for its logs (`Secrets`, bounded)."""
    return lambda: [Held("secrets.forms", len(secrets), MAX_REMEMBERED)]


class Census:
    def __init__(
        self,
        sources: Sequence[Source],
        *,
        metrics: Metrics,
        clock: Clock,
        interval_seconds: float,
    ) -> None:
        self._sources = sources
        self._metrics = metrics
        self._loop = Periodic(
            "census", self._publish, clock=clock, interval_seconds=interval_seconds
        )

    def take(self) -> list[Held]:
        """Every structure of every part, as it is now."""
        return [held for source in self._sources for held in source()]

    def start(self) -> None:
        if self._metrics.enabled:
            self._loop.start()

    async def close(self) -> None:
        await self._loop.close()

    async def _publish(self) -> None:
        self._metrics.held((held.structure, held.entries, held.bound) for held in self.take())
