"""The timer sweep: every replica applies the approval requests that expired while nobody
answered them, and ends the waits that outlived their workflow's deadline.

A wait's expiry is stored in its row when it begins (`workflow_checkpoints.wake_at`, written
with the checkpoint that asks for approval), so it survives every restart; whichever replica is
alive finds the due rows every `Settings.timer_interval_seconds` on the engine's clock, a
bounded batch per round. Each expiry goes through the same path as a person's decision
(`WorkflowService.expire`, a `graph.changes` change under the workflow's lease), computed
again from the state it is applied to: a decision that got there first, another replica's
sweep, or a row whose `wake_at` is wrong (earlier than its state says) makes it refused, so
it is applied exactly once or not at all. Rows another writer owns or changed, and rows of a
state format this engine does not read, are never selected.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import structlog

from workflow_engine._clock import Clock
from workflow_engine.domain.held import Held
from workflow_engine.domain.state_format import FIRST_STATE_FORMAT, STATE_FORMAT
from workflow_engine.errors import InvalidState, LeaseHeld, WorkflowEngineError
from workflow_engine.runtime._periodic import Periodic
from workflow_engine.storage import Connection, Pool, on_connection

log = structlog.get_logger(__name__)

#: Rows one round looks at, at most (the rest are due in the next round).
BATCH = 100
#: Of which one tenant's (project's), at most: its stuck rows cannot hold the others' off.
PER_TENANT = 20
#: How long a row whose `wake_at` was due but whose state was not is left out of the sweep.
SKIP_SECONDS = 60.0
#: How long a row whose expiry could not be applied now (the tenant is at its cap of running
#: workflows, the engine is stopping, an error) is left out: it must not take a place in
#: every round.
BACKOFF_SECONDS = 5.0

# The engine's waiting rows whose time has come, oldest first; by the partial index of
# migration 8. A blocked row, one another writer changed, or one this engine does not read is
# left alone (a decision about it is an operator's).
_DUE = """
SELECT task_id FROM (
    SELECT task_id::text, wake_at,
           row_number() OVER (PARTITION BY project_id ORDER BY wake_at) AS nth
      FROM workflow_checkpoints
     WHERE engine_owned AND wake_at IS NOT NULL AND wake_at <= %(now)s
       AND status = 'WAITING_FOR_APPROVAL'
       AND blocked_reason = '' AND NOT changed_outside
       AND state_format BETWEEN %(first_format)s AND %(state_format)s
       AND NOT (task_id::text = ANY(%(skip)s))) due
 WHERE nth <= %(per_tenant)s
 ORDER BY wake_at
 LIMIT %(limit)s
"""

#: `WorkflowService.expire`: the action it applied (reject, suspend), or None when not due.
Expire = Callable[[str], Awaitable[str | None]]


async def due(pool: Pool, now: float, skip: list[str], limit: int = BATCH) -> list[str]:
    """Task ids of the engine's waiting rows whose `wake_at` is at or before `now`."""
    params = {
        "now": datetime.fromtimestamp(now, UTC),
        "first_format": FIRST_STATE_FORMAT,
        "state_format": STATE_FORMAT,
        "skip": skip,
        "limit": limit,
        "per_tenant": PER_TENANT,
    }

    async def read(conn: Connection) -> list[str]:
        cur = await conn.execute(_DUE, params)
        return [row[0] for row in await cur.fetchall()]

    return await on_connection(pool, read)


class DeadlineSweep:
    """Periodic sweep for expired waits; `expire` applies one (see `WorkflowService.expire`),
    answering the action applied (reject, suspend) or None when the row was not due."""

    def __init__(
        self,
        *,
        pool: Pool,
        expire: Expire,
        clock: Clock,
        interval_seconds: float,
        on_expired: Callable[[str], None] | None = None,
    ) -> None:
        self._pool = pool
        self._expire = expire
        self._clock = clock
        self._on_expired = on_expired
        # Rows that were selected but whose state was not due (a `wake_at` out of step with
        # it): left out until then, so that they cannot take a round's places every round.
        self._skip: dict[str, float] = {}
        self._loop = Periodic(
            "deadline_sweep", self.sweep, clock=clock, interval_seconds=interval_seconds
        )

    def start(self) -> None:
        self._loop.start()

    async def close(self) -> None:
        await self._loop.close()

    def held(self) -> list[Held]:
        """Rows left out of the next sweeps: each ends within `SKIP_SECONDS`."""
        return [Held("deadlines.skipped", len(self._skip))]

    async def sweep(self) -> int:
        """Apply what expiries are due now; return how many were applied here."""
        now = self._clock.now()
        self._skip = {t: until for t, until in self._skip.items() if until > now}
        applied = 0
        for task_id in await due(self._pool, now, sorted(self._skip)):
            try:
                action = await self._expire(task_id)
            except (InvalidState, LeaseHeld) as exc:
                # A decision, a cancel or another replica got there first: nothing to do.
                log.debug("expiry_refused", task_id=task_id, error=exc.message)
                continue
            except Exception as exc:  # one row's trouble must not stop the others'
                if isinstance(exc, WorkflowEngineError):
                    log.warning("expiry_failed", task_id=task_id, error=exc.message)
                else:
                    log.exception("expiry_failed", task_id=task_id)
                self._skip[task_id] = now + BACKOFF_SECONDS
                continue
            if action is None:
                self._skip[task_id] = now + SKIP_SECONDS
                continue
            applied += 1
            log.info("approval_expired", task_id=task_id, action=action)
            if self._on_expired is not None:
                self._on_expired(action)
        return applied
