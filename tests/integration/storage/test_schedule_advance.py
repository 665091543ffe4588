"""Moving a schedule on is a compare-and-set on its next fire time: of two replicas that
handled the same slot, exactly one moves the schedule, and the other's move (from a slot the
schedule has left) changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from workflow_engine.storage import schedules


async def test_only_one_of_two_moves_from_the_same_slot_lands(autocommit_pool: Any) -> None:
    slot = datetime(2027, 1, 15, 8, tzinfo=UTC)
    async with autocommit_pool.connection() as conn:
        await conn.execute(
            "INSERT INTO workflow_schedules (schedule_id, cron, overlap, catch_up,"
            " next_fire_time) VALUES ('s', '@every 1h', 'SKIP', 'SKIP_MISSED', %s)",
            (slot,),
        )

    async def move(task_id: str, to: datetime) -> bool:
        return await schedules.advance(
            autocommit_pool,
            "s",
            old=slot,
            next_fire_time=to,
            last_fire_time=slot,
            task_id=task_id,
        )

    first = await move("first", slot + timedelta(hours=1))
    late = await move("late", slot + timedelta(hours=5))  # a replica that read the old slot
    async with autocommit_pool.connection() as conn:
        cur = await conn.execute(
            "SELECT next_fire_time, last_task_id FROM workflow_schedules WHERE schedule_id = 's'"
        )
        row = await cur.fetchone()
    assert (first, late) == (True, False)
    assert row == (slot + timedelta(hours=1), "first")
