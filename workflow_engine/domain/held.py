"""What a part of the engine holds in memory, structure by structure (issue 62).

An engine runs for months: nothing of a finished workflow may stay in its memory. Every
structure keyed by an id (a task, job, run, caller, watcher, workspace) therefore either ends
each entry with the thing it names (its workflow's run, its job, its watcher, its request) or
is a cache with a stated bound. Each owner tells which, with the number of entries it holds
now, through a `held()` method; the engine gathers them (`Engine.held`), the metric
``workflow_engine_held_entries{structure}`` shows them, and ``tests/e2e/test_held.py`` checks
them after workflows of every ending have ended.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Held:
    """One structure: `entries` now; `bound` the most it keeps, or 0 when each entry ends
    with what it names (so an engine with nothing live holds none)."""

    structure: str
    entries: int
    bound: int = 0

    @property
    def over(self) -> bool:
        """Whether it holds more than it may with nothing live: any entry of a structure
        whose entries end with their workflows, or more than a cache's bound."""
        return self.entries > self.bound
