"""Job slots shared fairly among tenants: a flood of one tenant's jobs makes no other wait long.

A semaphore serves its waiters in arrival order, so a tenant that queues a hundred jobs makes
every other tenant's next job wait for all of them. Here each tenant (the workflow's project)
queues apart, and a slot that frees goes to the waiting tenant with the fewest jobs running,
the one whose first waiter came first among equals; a tenant's own jobs keep their order. A
tenant with work therefore waits for one slot to free at most, whatever the others queued.

`per_tenant` (0: none) caps one tenant's running jobs even while slots are free: a tenant at
its cap waits, and the slots go to the others.

Uncontended, taking a slot is a comparison and a counter: nothing waits, nothing is sorted.
Only a slot freed while jobs wait looks at the waiting tenants (one pass over them).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from workflow_engine.domain.held import Held


class FairSlots:
    """`total` slots; see the module docstring."""

    def __init__(self, total: int, *, per_tenant: int = 0) -> None:
        if total < 1:
            raise ValueError(f"expected one or more slots, got {total}")
        self._free = total
        self._per_tenant = per_tenant
        self._running: dict[str, int] = {}
        # Tenant -> its waiters, oldest first: (arrival number, future set when granted).
        self._waiting: dict[str, deque[tuple[int, asyncio.Future[None]]]] = {}
        self._arrivals = itertools.count()

    def running(self, tenant: str) -> int:
        """How many slots `tenant` holds."""
        return self._running.get(tenant, 0)

    def waiting(self, tenant: str) -> int:
        """How many of `tenant`'s jobs wait for a slot."""
        return len(self._waiting.get(tenant, ()))

    def held(self) -> list[Held]:
        """Tenants with a job running or waiting; each is dropped at its last."""
        return [
            Held("job_slots.running_tenants", len(self._running)),
            Held("job_slots.waiting_tenants", len(self._waiting)),
        ]

    @asynccontextmanager
    async def slot(self, tenant: str) -> AsyncIterator[None]:
        """Hold one slot for `tenant` while the block runs."""
        await self.acquire(tenant)
        try:
            yield
        finally:
            self.release(tenant)

    async def acquire(self, tenant: str) -> None:
        """Take a slot for `tenant`, waiting for its turn when none is free to it."""
        # After every grant either no slot is free or every waiter's tenant is at its cap, so
        # a free slot that this tenant may hold is nobody else's turn.
        if self._free and self._may_run(tenant):
            self._take(tenant)
            return
        waiter = (next(self._arrivals), asyncio.get_running_loop().create_future())
        self._waiting.setdefault(tenant, deque()).append(waiter)
        try:
            await waiter[1]
        except asyncio.CancelledError:
            if waiter[1].done() and not waiter[1].cancelled():
                self.release(tenant)  # granted as it was cancelled: the next waiter's now
            else:
                self._leave(tenant, waiter)
            raise

    def release(self, tenant: str) -> None:
        """Give back a slot `tenant` held; the next waiter's turn (see the module docstring)."""
        left = self._running[tenant] - 1
        if left:
            self._running[tenant] = left
        else:
            del self._running[tenant]
        self._free += 1
        while self._free and self._waiting:
            turn = self._next_turn()
            if turn is None:
                return  # every waiter's tenant is at its cap
            queue = self._waiting[turn]
            _, granted = queue.popleft()
            if not queue:
                del self._waiting[turn]
            self._take(turn)
            granted.set_result(None)

    def _next_turn(self) -> str | None:
        """The waiting tenant with the fewest running (first come among equals) below its cap."""
        best: tuple[int, int, str] | None = None
        for tenant, queue in self._waiting.items():
            if self._may_run(tenant):
                candidate = (self.running(tenant), queue[0][0], tenant)
                if best is None or candidate < best:
                    best = candidate
        return best[2] if best else None

    def _may_run(self, tenant: str) -> bool:
        return not self._per_tenant or self.running(tenant) < self._per_tenant

    def _take(self, tenant: str) -> None:
        self._free -= 1
        self._running[tenant] = self.running(tenant) + 1

    def _leave(self, tenant: str, waiter: tuple[int, asyncio.Future[None]]) -> None:
        queue = self._waiting[tenant]
        queue.remove(waiter)
        if not queue:
            del self._waiting[tenant]
