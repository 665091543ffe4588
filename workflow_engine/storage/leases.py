"""The per-task lease: at most one runner makes progress on a task, anywhere.

Every statement runs on the database clock and decides in one step; nothing here reads and
then writes. `epoch` is the fencing token: it grows whenever the lease changes hands (or is
revoked), and every checkpoint write checks it in the same statement (see `_checkpointer`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg import AsyncConnection

from workflow_engine.domain.records import Fence, Lease

# The fence, written once. A runner proves it still holds the task's lease `l` (aliased so in
# every statement): it is the holder, at its epoch (which a takeover, even by the same holder,
# moves on), and the lease has not expired. Every fenced statement uses `FENCE`: the checkpoint
# write (`group_commit`, with the batch's columns for the values), renewal, and a runner's status
# change. Release uses `HELD` alone: a runner may release its own expired lease (nobody took it,
# or the epoch would differ), which frees the task at once instead of after the expiry.
HELD = "l.holder_id = {holder} AND l.epoch = {epoch}"
FENCE = HELD + " AND l.expires_at > now()"


def fence_sql(holder: str = "%(holder_id)s", epoch: str = "%(epoch)s") -> str:
    """`FENCE` with its holder and epoch taken from `holder` and `epoch` (SQL expressions)."""
    return FENCE.format(holder=holder, epoch=epoch)


# Insert the lease, or take it over where it is released or expired (or, for a resume, where
# the same holder had it: a restarted runner fences out its own older incarnation). No row back
# means someone else holds it. Every column the orchestrator's table has is given here: its ORM
# creates the table without defaults. `engine_lease_id` records that the engine took it.
_ACQUIRE = """
INSERT INTO task_workflow_leases AS l
    (id, task_id, lease_id, holder_id, expires_at, created_at, updated_at, epoch,
     engine_lease_id, handed_over, holder_process)
VALUES (gen_random_uuid(), %(task_id)s, %(lease_id)s, %(holder_id)s,
        now() + make_interval(secs => %(ttl)s), now(), now(), 1, %(lease_id)s, false,
        %(process)s)
ON CONFLICT (task_id) DO UPDATE
   SET lease_id = EXCLUDED.lease_id,
       holder_id = EXCLUDED.holder_id,
       expires_at = EXCLUDED.expires_at,
       epoch = l.epoch + 1,
       updated_at = now(),
       engine_lease_id = EXCLUDED.lease_id,
       handed_over = false,
       holder_process = EXCLUDED.holder_process
 WHERE """

# Whom each kind of acquire may take the lease from. A holder takes over its own live lease only
# in the engine process that took it (a restarted process keeps its name, `process_name`), never
# from another process of the same engine that may be running the workflow right now.
_TAKE_FREE = "l.holder_id IS NULL OR l.expires_at IS NULL OR l.expires_at <= now()"
_TAKE_OWN = (
    " OR (%(take_own)s AND l.holder_id = %(holder_id)s"
    " AND l.holder_process IS NOT DISTINCT FROM %(process)s)"
)
# Automatic recovery takes only what the engine left for another replica: a lease the engine
# itself took last, and then handed over (drain) or let expire (crash). A lease the
# orchestrator released (holder null, not handed over) or took itself stays where it is.
ORPHANED = (
    "l.lease_id = l.engine_lease_id"
    " AND ((l.holder_id IS NULL AND l.handed_over) OR l.expires_at <= now())"
)
_RETURNING = """
RETURNING task_id::text, lease_id::text, holder_id, epoch, expires_at, true, holder_process
"""
ACQUIRE = _ACQUIRE + _TAKE_FREE + _TAKE_OWN + _RETURNING
ACQUIRE_ORPHANED = _ACQUIRE + ORPHANED + _RETURNING

CURRENT = """
SELECT task_id::text, lease_id::text, holder_id, epoch, expires_at,
       holder_id IS NOT NULL AND expires_at > now(), holder_process
  FROM task_workflow_leases
 WHERE task_id = %(task_id)s
"""

RENEW = (
    """
UPDATE task_workflow_leases AS l
   SET expires_at = now() + make_interval(secs => %(ttl)s), updated_at = now()
 WHERE l.task_id = %(task_id)s AND """
    + fence_sql()
    + """
RETURNING l.expires_at
"""
)

# The engine releases a lease only for someone to carry on (or at the end, when nothing
# follows): it is handed over, which automatic recovery may take.
RELEASE = """
UPDATE task_workflow_leases AS l
   SET holder_id = NULL, expires_at = NULL, updated_at = now(), handed_over = true
 WHERE l.task_id = %(task_id)s AND """ + HELD.format(holder="%(holder_id)s", epoch="%(epoch)s")

FENCE_HOLDS = (
    "SELECT 1 FROM task_workflow_leases AS l WHERE l.task_id = %(task_id)s AND " + fence_sql()
)

# Lock the lease row for a fenced change of other rows of the task (a runner's status change);
# no row back means the fence no longer holds.
LOCK_FENCED = (
    "SELECT 1 FROM task_workflow_leases AS l WHERE l.task_id = %(task_id)s AND "
    + fence_sql()
    + " FOR UPDATE"
)

# Take the lease from whoever has it (cancel): release it and move the epoch on, so the old
# holder's next fenced write fails.
REVOKE = """
UPDATE task_workflow_leases
   SET holder_id = NULL, expires_at = NULL, epoch = epoch + 1, updated_at = now(),
       handed_over = false
 WHERE task_id = %(task_id)s
"""


def _lease(row: tuple[Any, ...]) -> Lease:
    return Lease(
        task_id=row[0],
        lease_id=row[1],
        holder_id=row[2],
        epoch=int(row[3]),
        expires_at=row[4],
        live=bool(row[5]),
        holder_process=row[6],
    )


async def acquire(
    conn: AsyncConnection[Any],
    *,
    task_id: str,
    lease_id: str,
    holder_id: str,
    ttl_seconds: float,
    process: str | None = None,
    take_own: bool = False,
    orphaned_only: bool = False,
) -> Lease | None:
    """Take the lease for `holder_id`, in engine process `process`, in one statement; `None`
    when another holder (or another process of this one) has it live.

    `take_own`: also from this holder's live lease taken in this process (a resume).
    `orphaned_only`: only a lease the engine handed over or let expire (automatic recovery;
    see `ORPHANED`).
    """
    cur = await conn.execute(
        ACQUIRE_ORPHANED if orphaned_only else ACQUIRE,
        {
            "task_id": task_id,
            "lease_id": lease_id,
            "holder_id": holder_id,
            "process": process,
            "ttl": ttl_seconds,
            "take_own": take_own,
        },
    )
    row = await cur.fetchone()
    return _lease(row) if row else None


async def current(conn: AsyncConnection[Any], task_id: str) -> Lease | None:
    cur = await conn.execute(CURRENT, {"task_id": task_id})
    row = await cur.fetchone()
    return _lease(row) if row else None


async def renew(conn: AsyncConnection[Any], fence: Fence, ttl_seconds: float) -> datetime | None:
    """Extend the lease; `None` means it is lost (expired, taken over or revoked)."""
    cur = await conn.execute(
        RENEW,
        {
            "task_id": fence.task_id,
            "holder_id": fence.holder_id,
            "epoch": fence.epoch,
            "ttl": ttl_seconds,
        },
    )
    row = await cur.fetchone()
    return row[0] if row else None


async def release(conn: AsyncConnection[Any], fence: Fence) -> bool:
    """Release the lease if this fence still holds it; idempotent."""
    cur = await conn.execute(
        RELEASE, {"task_id": fence.task_id, "holder_id": fence.holder_id, "epoch": fence.epoch}
    )
    return cur.rowcount == 1


async def holds(conn: AsyncConnection[Any], fence: Fence) -> bool:
    """Whether `fence` still holds its lease (a read: nothing is locked or written)."""
    cur = await conn.execute(
        FENCE_HOLDS,
        {"task_id": fence.task_id, "holder_id": fence.holder_id, "epoch": fence.epoch},
    )
    return await cur.fetchone() is not None


async def lock_fenced(conn: AsyncConnection[Any], fence: Fence) -> bool:
    """Lock the lease row (until the transaction ends) if `fence` still holds it."""
    cur = await conn.execute(
        LOCK_FENCED,
        {"task_id": fence.task_id, "holder_id": fence.holder_id, "epoch": fence.epoch},
    )
    return await cur.fetchone() is not None


async def revoke(conn: AsyncConnection[Any], task_id: str) -> None:
    await conn.execute(REVOKE, {"task_id": task_id})
