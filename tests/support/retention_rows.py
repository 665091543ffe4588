"""Workflow rows written by SQL in bulk, as the engine (or another writer) leaves them, for the
retention tests: thousands in a second, each with its events, task and lease row.

`fill` inserts `count` workflows of one kind; `snapshot` reads back what retention may touch,
so a test compares before and after table by table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Workflows of one kind: `count` rows of `status`, last changed `age_days` ago, `events` each.
_FILL = """
WITH rows AS (
    INSERT INTO workflow_checkpoints
        (id, task_id, state, last_node_id, updated_at, created_at, run_id, status,
         event_seq, engine_owned, state_format)
    SELECT gen_random_uuid(), gen_random_uuid(), '{}'::jsonb, 'finalize_summary',
           now() - make_interval(secs => %(age)s * 86400), now() - interval '400 days',
           gen_random_uuid(), %(status)s, %(events)s, %(owned)s, %(state_format)s
      FROM generate_series(1, %(count)s)
    RETURNING task_id, run_id
), events AS (
    INSERT INTO workflow_events (task_id, seq, run_id, kind, node_id, status)
    SELECT r.task_id, s, r.run_id,
           CASE WHEN s IN (1, %(events)s) THEN 'status' ELSE 'node' END,
           CASE WHEN s IN (1, %(events)s) THEN NULL ELSE 'dispatch_step' END,
           CASE WHEN s = %(events)s THEN %(status)s ELSE 'RUNNING' END
      FROM rows r CROSS JOIN generate_series(1, %(events)s) s
), tasks AS (
    INSERT INTO workflow_tasks (task_id, spec) SELECT task_id, '{}'::jsonb FROM rows
), leases AS (
    INSERT INTO task_workflow_leases
        (id, task_id, lease_id, holder_id, expires_at, created_at, updated_at, engine_lease_id)
    SELECT gen_random_uuid(), task_id, l.id,
           CASE WHEN %(lease)s = 'held' THEN 'someone' END,
           CASE WHEN %(lease)s = 'held' THEN now() + interval '1 hour' END,
           now(), now(),
           CASE WHEN %(lease)s = 'theirs' THEN NULL ELSE l.id END
      FROM rows CROSS JOIN LATERAL (SELECT gen_random_uuid() AS id) l
     WHERE %(lease)s <> 'none'
)
SELECT task_id::text FROM rows
"""


@dataclass(frozen=True)
class Kind:
    """One kind of workflow row to fill in.

    `lease`: ``free`` (released, the engine's), ``held`` (live, someone's), ``theirs`` (free,
    last taken by the orchestrator) or ``none`` (no lease row). `state_format`: the row's.
    """

    status: str
    age_days: float
    count: int
    events: int = 6
    owned: bool = True
    lease: str = "free"
    state_format: int = 1  # a newer engine's (past this one's `STATE_FORMAT`) is left to it


async def fill(conn: Any, kind: Kind) -> list[str]:
    """Insert `kind.count` workflows of `kind`; their task ids."""
    cur = await conn.execute(
        _FILL,
        {
            "status": kind.status,
            "age": kind.age_days,
            "count": kind.count,
            "events": kind.events,
            "owned": kind.owned,
            "lease": kind.lease,
            "state_format": kind.state_format,
        },
    )
    return [row[0] for row in await cur.fetchall()]


@dataclass(frozen=True)
class Snapshot:
    """What retention may touch of some tasks: rows per table, and events per task."""

    events: dict[str, int]
    tasks: int
    checkpoints: int
    leases: int


async def snapshot(conn: Any, task_ids: list[str]) -> Snapshot:
    cur = await conn.execute(
        "SELECT task_id::text, count(*) FROM workflow_events WHERE task_id = ANY(%s::uuid[])"
        " GROUP BY task_id",
        (task_ids,),
    )
    events = {task_id: int(n) for task_id, n in await cur.fetchall()}
    counts = []
    for table in ("workflow_tasks", "workflow_checkpoints", "task_workflow_leases"):
        cur = await conn.execute(
            f"SELECT count(*) FROM {table} WHERE task_id = ANY(%s::uuid[])",
            (task_ids,),
        )
        row = await cur.fetchone()
        counts.append(int(row[0]))
    return Snapshot(events, *counts)
