"""The schedules table (``workflow_schedules``, migration 9): create, read, list, change, delete,
the due query, and the compare-and-set that moves a schedule to its next slot.

Every replica may fire schedules; `advance` is how they agree: it moves `next_fire_time` on
only when it still holds the value the replica decided from, so of two replicas that handled
the same slot one advances and the other's update changes nothing. (The slot's workflow is
started before, under a task id derived from the slot, so both meet at that start too.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, LiteralString

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from workflow_engine.domain.records import Scope
from workflow_engine.domain.schedules import ScheduleRecord
from workflow_engine.storage._pool import Connection, Pool, on_connection

_COLUMNS = """
schedule_id, project_id, user_id, cron, time_zone, task, template_task_id, overlap, catch_up,
paused, next_fire_time, last_fire_time, last_task_id, created_by, created_at, updated_at,
public_id
"""

_INSERT = (
    """
INSERT INTO workflow_schedules
    (schedule_id, project_id, user_id, cron, time_zone, task, template_task_id, overlap,
     catch_up, paused, next_fire_time, created_by, public_id)
VALUES (%(schedule_id)s, %(project_id)s, %(user_id)s, %(cron)s, %(time_zone)s, %(task)s,
        %(template_task_id)s, %(overlap)s, %(catch_up)s, %(paused)s, %(next_fire_time)s,
        %(created_by)s, %(public_id)s)
ON CONFLICT (schedule_id) DO NOTHING
RETURNING """
    + _COLUMNS
)

# The schedules callers name `schedule_id`: the one whose key it is, then those of other
# tenants that named it too (`domain.schedules.own_key`), oldest first.
_NAMED = (
    "SELECT "
    + _COLUMNS
    + """
  FROM workflow_schedules
 WHERE (schedule_id = %(schedule_id)s AND public_id IS NULL) OR public_id = %(schedule_id)s
 ORDER BY public_id IS NOT NULL, created_at
"""
)

# The scope filter of ListWorkflows (`queries.list_statement`), on a schedule's owner.
_SCOPED = """
   AND (cardinality(%(scope_projects)s::text[]) = 0
        OR project_id = ANY(%(scope_projects)s::text[]))
   AND (cardinality(%(scope_users)s::text[]) = 0 OR user_id = ANY(%(scope_users)s::text[]))
"""

# Newest first, keyset-paginated on (created_at DESC, schedule_id).
_LIST = (
    "SELECT "
    + _COLUMNS
    + """
  FROM workflow_schedules
 WHERE (%(after_created_at)s::timestamptz IS NULL
        OR created_at < %(after_created_at)s
        OR (created_at = %(after_created_at)s AND schedule_id > %(after_schedule_id)s))
"""
    + _SCOPED
    + """
 ORDER BY created_at DESC, schedule_id
 LIMIT %(limit)s
"""
)

_UPDATE = (
    """
UPDATE workflow_schedules
   SET project_id = %(project_id)s, user_id = %(user_id)s, cron = %(cron)s,
       time_zone = %(time_zone)s, task = %(task)s, template_task_id = %(template_task_id)s,
       overlap = %(overlap)s, catch_up = %(catch_up)s, paused = %(paused)s,
       next_fire_time = %(next_fire_time)s, updated_at = now()
 WHERE schedule_id = %(schedule_id)s AND updated_at = %(updated_at)s
RETURNING """
    + _COLUMNS
)

_DELETE = "DELETE FROM workflow_schedules WHERE schedule_id = %(schedule_id)s"

# The due schedules, oldest slot first (by workflow_schedules_due_idx).
# The due schedules, oldest slot first, at most `per_tenant` of each project: a tenant with
# thousands due (or stuck) cannot take a round's every place from the others. Schedules the
# caller is backing off from (`skip`) are left out.
_DUE = (
    "SELECT "
    + _COLUMNS
    + """
  FROM (SELECT s.*, row_number() OVER (PARTITION BY project_id ORDER BY next_fire_time) AS nth
          FROM workflow_schedules s
         WHERE NOT paused AND next_fire_time <= %(now)s
           AND NOT (schedule_id = ANY(%(skip)s))) due
 WHERE nth <= %(per_tenant)s
 ORDER BY next_fire_time
 LIMIT %(limit)s
"""
)

_ADVANCE = """
UPDATE workflow_schedules
   SET next_fire_time = %(next_fire_time)s, last_fire_time = %(last_fire_time)s,
       last_task_id = CASE WHEN %(task_id)s::text = '' THEN last_task_id ELSE %(task_id)s END,
       updated_at = now()
 WHERE schedule_id = %(schedule_id)s AND NOT paused AND next_fire_time = %(old)s
"""

# Whether a schedule's previous workflow has not finished (for overlap SKIP).
_UNFINISHED = """
SELECT 1 FROM workflow_checkpoints
 WHERE task_id = %(task_id)s AND status NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED')
"""

_STARTED_BY = """
SELECT schedule_id, schedule_slot FROM workflow_checkpoints WHERE task_id = %(task_id)s
"""


@dataclass(frozen=True, slots=True)
class SchedulePage:
    items: Sequence[ScheduleRecord]
    #: (created_at, schedule_id) of the last item when more follow; None on the last page.
    next_after: tuple[datetime, str] | None


def _values(record: ScheduleRecord) -> dict[str, Any]:
    return {
        "schedule_id": record.schedule_id,
        "project_id": record.project_id,
        "user_id": record.user_id,
        "cron": record.cron,
        "time_zone": record.time_zone,
        "task": Jsonb(record.task) if record.task is not None else None,
        "template_task_id": record.template_task_id,
        "overlap": record.overlap,
        "catch_up": record.catch_up,
        "paused": record.paused,
        "next_fire_time": record.next_fire_time,
        "created_by": record.created_by,
        "updated_at": record.updated_at,
        "public_id": record.public_id,
    }


async def _one(pool: Pool, sql: LiteralString, params: dict[str, Any]) -> ScheduleRecord | None:
    async def run(conn: Connection) -> ScheduleRecord | None:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql, params)
            row = await cur.fetchone()
        return ScheduleRecord(**row) if row is not None else None

    return await on_connection(pool, run)


async def _many(pool: Pool, sql: LiteralString, params: dict[str, Any]) -> list[ScheduleRecord]:
    async def run(conn: Connection) -> list[ScheduleRecord]:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql, params)
            return [ScheduleRecord(**row) for row in await cur.fetchall()]

    return await on_connection(pool, run)


async def insert(pool: Pool, record: ScheduleRecord) -> ScheduleRecord | None:
    """Store a new schedule (its times are the database's); None when its key is taken."""
    return await _one(pool, _INSERT, _values(record))


async def named(pool: Pool, schedule_id: str) -> list[ScheduleRecord]:
    """Every schedule callers name `schedule_id` (one per tenant at most), the one keyed by
    it first."""
    return await _many(pool, _NAMED, {"schedule_id": schedule_id})


async def list_page(
    pool: Pool, scope: Scope | None, limit: int, after: tuple[datetime, str] | None
) -> SchedulePage:
    """One page of the schedules `scope` admits, newest first."""
    rows = await _many(
        pool,
        _LIST,
        {
            "after_created_at": after[0] if after else None,
            "after_schedule_id": after[1] if after else "",
            "scope_projects": sorted(scope.projects) if scope else [],
            "scope_users": sorted(scope.users) if scope else [],
            "limit": limit + 1,
        },
    )
    items = rows[:limit]
    more = len(rows) > limit and items
    return SchedulePage(items, (items[-1].created_at, items[-1].schedule_id) if more else None)


async def replace(pool: Pool, record: ScheduleRecord) -> ScheduleRecord | None:
    """Store `record`'s fields over the row as it was read (its `updated_at`); None when the
    row changed meanwhile (or is gone): read it again."""
    return await _one(pool, _UPDATE, _values(record))


async def delete(pool: Pool, schedule_id: str) -> bool:
    async def run(conn: Connection) -> bool:
        cur = await conn.execute(_DELETE, {"schedule_id": schedule_id})
        return cur.rowcount > 0

    return await on_connection(pool, run)


async def due(
    pool: Pool, now: datetime, limit: int, *, per_tenant: int, skip: Sequence[str] = ()
) -> list[ScheduleRecord]:
    """Unpaused schedules whose next slot is at or before `now`, the oldest slot first, at
    most `per_tenant` of one project, none of `skip`."""
    params = {"now": now, "limit": limit, "per_tenant": per_tenant, "skip": list(skip)}
    return await _many(pool, _DUE, params)


async def started_by(pool: Pool, task_id: str) -> tuple[str | None, datetime | None]:
    """The schedule and slot that started the workflow of `task_id`, as its row says
    ((None, None) when no schedule did, or there is no such row)."""

    async def run(conn: Connection) -> tuple[str | None, datetime | None]:
        cur = await conn.execute(_STARTED_BY, {"task_id": task_id})
        row = await cur.fetchone()
        return (row[0], row[1]) if row is not None else (None, None)

    return await on_connection(pool, run)


async def advance(
    pool: Pool,
    schedule_id: str,
    *,
    old: datetime,
    next_fire_time: datetime | None,
    last_fire_time: datetime,
    task_id: str,
) -> bool:
    """Move the schedule from slot `old` on (compare-and-set): True when this call did; False
    when another replica did first, or it was paused, changed or deleted meanwhile."""
    params = {
        "schedule_id": schedule_id,
        "old": old,
        "next_fire_time": next_fire_time,
        "last_fire_time": last_fire_time,
        "task_id": task_id,
    }

    async def run(conn: Connection) -> bool:
        cur = await conn.execute(_ADVANCE, params)
        return cur.rowcount > 0

    return await on_connection(pool, run)


async def unfinished(pool: Pool, task_id: str) -> bool:
    """Whether the workflow of `task_id` exists and has not finished."""
    if not task_id:
        return False

    async def run(conn: Connection) -> bool:
        cur = await conn.execute(_UNFINISHED, {"task_id": task_id})
        return await cur.fetchone() is not None

    return await on_connection(pool, run)
