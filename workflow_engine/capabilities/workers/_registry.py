"""The worker nodes this engine may send jobs to: their health, their load, and the choice.

Selection, for one job: the nodes that have every label the step requires, then of those the
ready ones (their last ``GET /readyz`` answered 200), then those with room (this engine's jobs
on the node below its ``max_jobs``); among them the least loaded (the lowest share of its
``max_jobs`` in use), then the one with most of the task's preferred labels (locality, models),
then by name. Load is this engine's own count: a job counts from its selection (a reservation,
which lapses if the job is never sent, say because the run stopped before collecting it) until
its request ends.

The set of nodes may change while the engine runs (`update`, from a source that is refreshed):
a node that joins is not ready until its health is asked; one that leaves gets no new jobs, but
stays known, so a job already recorded for it still goes to it.

Nothing here does I/O: the worker feeds in health from its poller and load from its requests,
and waits here for a change when no node is eligible.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from workflow_engine.capabilities.workers._nodes_file import WorkerNode
from workflow_engine.domain.held import Held
from workflow_engine.domain.jobs import JobRequest

#: How long a selected job counts against its node before it is sent.
RESERVATION_SECONDS = 60.0


@dataclass(slots=True)
class Health:
    """A node's last known readiness, and why not when it is not."""

    ready: bool = False
    reason: str = "not asked yet"


class NodeRegistry:
    """The configured nodes, their health and this engine's jobs on each; see the module doc."""

    def __init__(
        self,
        nodes: Iterable[WorkerNode] = (),
        *,
        clock: Callable[[], float] = time.monotonic,
        reservation_seconds: float = RESERVATION_SECONDS,
    ) -> None:
        # Every node this engine has known, by name: a job recorded for a node that has since
        # left keeps going to it. `_current` are those that may get new jobs.
        self._nodes: dict[str, WorkerNode] = {}
        self._current: set[str] = set()
        #: Nodes the source lists but cannot use, and why (repeated when no node is eligible).
        self._unusable: dict[str, str] = {}
        self._health: dict[str, Health] = {}
        # node -> job id -> when its reservation lapses (None: its request is under way).
        self._jobs: dict[str, dict[str, float | None]] = {}
        self._clock = clock
        self._reservation_seconds = reservation_seconds
        self._changed = asyncio.Event()
        self.update(nodes)

    @property
    def nodes(self) -> tuple[WorkerNode, ...]:
        """The nodes that may get new jobs, by name."""
        return tuple(self._nodes[name] for name in sorted(self._current))

    def node(self, name: str) -> WorkerNode | None:
        """`name`, also when it has left (its recorded jobs still go to it); None if unknown."""
        return self._nodes.get(name)

    def update(
        self, nodes: Iterable[WorkerNode], unusable: Mapping[str, str] | None = None
    ) -> tuple[list[str], list[str]]:
        """Make `nodes` the ones that get new jobs; returns the names that joined and left.

        A node that left keeps its load and stays known for the jobs recorded for it. One that
        joins, or whose URL changed, is not ready until its health is next asked.
        """
        given = {node.name: node for node in nodes}
        joined = sorted(name for name in given if name not in self._current)
        left = sorted(self._current - given.keys())
        for name, node in given.items():
            known = self._nodes.get(name)
            if name in joined or known is None or known.url != node.url:
                self._health[name] = Health()
            self._nodes[name] = node
            self._jobs.setdefault(name, {})
        self._current = set(given)
        self._unusable = {k: v for k, v in (unusable or {}).items() if k not in given}
        if joined or left:
            self._notify()
        return joined, left

    def health(self, name: str) -> Health:
        return self._health[name]

    def set_health(self, name: str, ready: bool, reason: str = "") -> bool:
        """Record a node's readiness; True when it changed."""
        health = self._health[name]
        changed = health.ready != ready
        health.ready, health.reason = ready, reason
        if changed:
            self._notify()
        return changed

    def load(self, name: str) -> int:
        """This engine's jobs on `name`: under way, or selected and not yet lapsed."""
        jobs = self._jobs[name]
        now = self._clock()
        for job_id in [j for j, until in jobs.items() if until is not None and until <= now]:
            del jobs[job_id]
        return len(jobs)

    def choose(self, job: JobRequest) -> tuple[WorkerNode | None, str]:
        """The node for `job`, or None and why no node can take it now (node by node)."""
        required = set(job.required_labels)
        preferred = set(job.preferred_labels)
        ranked: list[tuple[float, int, str]] = []
        why: list[str] = []
        for node in self.nodes:
            name = node.name
            missing = required - node.labels
            if missing:
                why.append(f"{name} lacks {', '.join(sorted(missing))}")
                continue
            health = self._health[name]
            if not health.ready:
                why.append(f"{name} is not ready ({health.reason})")
                continue
            load = self.load(name)
            if load >= node.max_jobs:
                why.append(f"{name} is full ({load}/{node.max_jobs} jobs)")
                continue
            ranked.append((load / node.max_jobs, -len(preferred & node.labels), name))
        why += [f"{name} is not usable ({reason})" for name, reason in self._unusable.items()]
        if not ranked:
            return None, "; ".join(sorted(why)) or "there are no worker nodes"
        return self._nodes[min(ranked)[2]], ""

    def held(self) -> list[Held]:
        """This engine's jobs on nodes, under way or reserved (lapsed ones dropped now)."""
        return [Held("nodes.jobs", sum(self.load(name) for name in self._jobs))]

    def reserve(self, name: str, job_id: str) -> None:
        """Count `job_id` against `name` from its selection (any earlier choice is dropped)."""
        for jobs in self._jobs.values():
            jobs.pop(job_id, None)
        self._jobs[name][job_id] = self._clock() + self._reservation_seconds

    def started(self, name: str, job_id: str) -> None:
        """`job_id`'s request to `name` is under way: it counts until `finished`."""
        self._jobs[name][job_id] = None

    def finished(self, name: str, job_id: str) -> None:
        """`job_id`'s request to `name` ended: room for another job there."""
        self._jobs[name].pop(job_id, None)
        self._notify()

    async def wait_for_change(self, seconds: float) -> None:
        """Return when health or load changes, or after `seconds`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._changed.wait()

    def _notify(self) -> None:
        # Wake every waiter once; later waiters wait on a fresh event.
        self._changed.set()
        self._changed = asyncio.Event()
