"""Job slots go to the waiting tenant with the fewest running, not to whoever queued first.

Each test queues waiters as asyncio tasks and frees slots one at a time, recording the order in
which the waiters got theirs: orderings and counts, no clocks.
"""

from __future__ import annotations

import asyncio

import pytest

from workflow_engine.capabilities._fair_slots import FairSlots


async def settle() -> None:
    """Let every task that can run do so (a few turns of the loop; nothing here sleeps)."""
    for _ in range(5):
        await asyncio.sleep(0)


class Queue:
    """Waiters for `slots`, each named; `granted` is the order in which they got a slot."""

    def __init__(self, slots: FairSlots) -> None:
        self.slots = slots
        self.granted: list[str] = []
        self.tasks: dict[str, asyncio.Task[None]] = {}

    async def wait(self, name: str, tenant: str) -> None:
        async def waiter() -> None:
            await self.slots.acquire(tenant)
            self.granted.append(name)

        self.tasks[name] = asyncio.create_task(waiter())
        await settle()


async def test_uncontended_slots_are_taken_at_once() -> None:
    slots = FairSlots(2)
    await slots.acquire("a")
    await slots.acquire("b")
    assert (slots.running("a"), slots.running("b")) == (1, 1)
    slots.release("a")
    assert slots.running("a") == 0


async def test_a_freed_slot_goes_to_the_tenant_with_the_fewest_running() -> None:
    """Tenant a holds both slots and queued four more before b's one: b's is next, then a's
    go on in their own order."""
    slots = FairSlots(2)
    queue = Queue(slots)
    await slots.acquire("a")
    await slots.acquire("a")
    for i in range(4):
        await queue.wait(f"a{i}", "a")
    await queue.wait("b0", "b")
    assert queue.granted == [] and (slots.waiting("a"), slots.waiting("b")) == (4, 1)

    slots.release("a")
    await settle()
    assert queue.granted == ["b0"]
    for _ in range(4):
        slots.release("a")
        await settle()
    assert queue.granted == ["b0", "a0", "a1", "a2", "a3"]


async def test_among_tenants_running_as_many_the_first_come_goes_first() -> None:
    slots = FairSlots(3)
    queue = Queue(slots)
    for tenant in ("a", "c", "x"):
        await slots.acquire(tenant)
    await queue.wait("c0", "c")
    await queue.wait("a0", "a")
    await queue.wait("a1", "a")
    await queue.wait("c1", "c")
    # Each time, a and c run one job each when the slot frees.
    for ending in ("x", "c", "a", "a"):
        slots.release(ending)
        await settle()
    assert queue.granted == ["c0", "a0", "a1", "c1"]


async def test_a_tenant_at_its_cap_waits_while_others_use_the_free_slots() -> None:
    slots = FairSlots(3, per_tenant=1)
    queue = Queue(slots)
    await slots.acquire("a")
    await queue.wait("a0", "a")
    await queue.wait("b0", "b")
    await queue.wait("b1", "b")
    # b0 got a free slot at once; a0 and b1 wait, their tenants at the cap; one slot is idle.
    assert queue.granted == ["b0"]
    assert (slots.waiting("a"), slots.waiting("b")) == (1, 1)
    slots.release("a")
    await settle()
    assert queue.granted == ["b0", "a0"]
    slots.release("b")
    await settle()
    assert queue.granted == ["b0", "a0", "b1"]


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    slots = FairSlots(1)
    queue = Queue(slots)
    await slots.acquire("a")
    await queue.wait("b0", "b")
    await queue.wait("b1", "b")
    queue.tasks["b0"].cancel()
    await settle()
    assert slots.waiting("b") == 1
    slots.release("a")
    await settle()
    assert queue.granted == ["b1"]


async def test_a_slot_granted_to_a_waiter_cancelled_meanwhile_goes_to_the_next() -> None:
    """The slot was handed over, but its waiter was cancelled before it ran: no slot is lost."""
    slots = FairSlots(1)
    queue = Queue(slots)
    await slots.acquire("a")
    await queue.wait("b0", "b")
    await queue.wait("c0", "c")
    slots.release("a")  # granted to b0, which has not run yet
    queue.tasks["b0"].cancel()
    await settle()
    assert queue.granted == ["c0"]
    assert (slots.running("b"), slots.running("c")) == (0, 1)


async def test_the_slot_block_gives_its_slot_back() -> None:
    slots = FairSlots(1)

    async def failing_job() -> None:
        async with slots.slot("a"):
            assert slots.running("a") == 1
            raise RuntimeError("the job failed")

    with pytest.raises(RuntimeError):
        await failing_job()
    async with slots.slot("b"):
        assert slots.running("b") == 1
    assert slots.running("a") == slots.running("b") == 0


def test_no_slots_is_refused() -> None:
    with pytest.raises(ValueError, match="one or more"):
        FairSlots(0)
