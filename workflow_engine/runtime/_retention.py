"""Retention in the background: every replica looks for finished workflows that are due, every
`interval_seconds`, and prunes them batch by batch (`storage._retention`).

Each batch holds the fleet's retention lock for its own short transaction only; a replica that
finds it taken leaves the round to whoever holds it and looks again at its next interval. So
one replica prunes at a time, without a connection held for it, and a replica that dies
mid-batch leaves nothing half done (its transaction rolls back, the lock goes with it).
`workflow-engine prune` runs the same rounds on demand (`prune_all`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import psycopg
import structlog

from workflow_engine._clock import Clock, SystemClock, jittered
from workflow_engine.config import ENV_PREFIX, RetentionSettings, Settings
from workflow_engine.errors import ConfigError
from workflow_engine.storage import (
    Connection,
    Pool,
    Pruned,
    count_due,
    database_url,
    is_transient,
    open_pool,
    prune_batch,
    run_migrations,
)
from workflow_engine.telemetry import Metrics

log = structlog.get_logger(__name__)

DAY_SECONDS = 86400.0
# Between two batches, `_IDLE_RATIO` times as long as the last one took: the pruner has the
# database a tenth of the time at most, so the writes of running workflows keep theirs (a round
# still prunes hundreds of workflows a second, far more than finish). `retention_cost.py`, 8
# writers on 2 cores: at 3, 13.5% fewer writes while pruning and p99 1.63x; at 9, 5.6% and 1.30x.
_IDLE_RATIO = 9.0
_MIN_PAUSE_SECONDS = 0.02


def rest_after(batch_seconds: float) -> float:
    """How long the pruner rests after a batch that took `batch_seconds` (see `_IDLE_RATIO`)."""
    return max(_MIN_PAUSE_SECONDS, _IDLE_RATIO * batch_seconds)


async def prune_all(
    connection: Callable[[], AbstractAsyncContextManager[Connection]],
    *,
    older_than_seconds: float,
    delete_rows: bool,
    batch_size: int,
    wait: bool = False,
    metrics: Metrics | None = None,
    clock: Clock | None = None,
) -> Pruned | None:
    """Prune every workflow due now, batch by batch, each on a `connection()` of its own,
    resting after each on `clock` (`rest_after`); what was removed. `None` when another batch
    held the retention lock first (with `wait`, wait for it instead), which ends the round for
    this caller after what it pruned so far.

    What is due is decided on the database's clock (`storage._retention` compares each row's
    `updated_at` with its `now()`), the one clock every replica shares; `clock` only paces."""
    clock = SystemClock() if clock is None else clock
    total = Pruned()
    while True:
        started = clock.monotonic()
        async with connection() as conn:
            pruned = await prune_batch(
                conn,
                older_than_seconds=older_than_seconds,
                delete_rows=delete_rows,
                limit=batch_size,
                wait=wait,
            )
        if pruned is None:
            return total if total.workflows else None
        if metrics is not None and pruned.workflows:
            metrics.retention_pruned(pruned.workflows, pruned.tables)
        total += pruned
        if not pruned.workflows:  # nothing due is left (or what is, somebody writes now)
            if metrics is not None:
                metrics.retention_round_done()
            return total
        await clock.sleep(rest_after(clock.monotonic() - started))


async def prune_command(settings: Settings, older_than_days: float, *, dry_run: bool) -> str:
    """`workflow-engine prune`: one round now, waiting for the background's batches, with the
    settings' `delete_rows`; what it removed (or, with `dry_run`, would remove, changing
    nothing: not even the schema), as lines to print."""
    older_than = older_than_days * DAY_SECONDS
    delete_rows = settings.retention.delete_rows
    async with database_url(settings) as url:
        pool = await open_pool(url, settings)
        try:
            if dry_run:
                async with pool.connection() as conn:
                    pruned = await _counted(conn, older_than, delete_rows)
            else:
                await run_migrations(pool)
                found = await prune_all(
                    pool.connection,
                    older_than_seconds=older_than,
                    delete_rows=delete_rows,
                    batch_size=settings.retention.batch_size,
                    wait=True,
                )
                pruned = found or Pruned()
        finally:
            await pool.close()
    return report(pruned, older_than_days, delete_rows=delete_rows, dry_run=dry_run)


async def _counted(conn: Connection, older_than: float, delete_rows: bool) -> Pruned:
    try:
        return await count_due(conn, older_than_seconds=older_than, delete_rows=delete_rows)
    except psycopg.errors.UndefinedColumn:
        raise ConfigError(
            "the database's schema is older than this engine's: run `workflow-engine migrate`"
        ) from None


def report(pruned: Pruned, older_than_days: float, *, delete_rows: bool, dry_run: bool) -> str:
    """`prune`'s answer: the workflows, then the rows of each table (one ``table: n`` a line)."""
    verb = "would prune" if dry_run else "pruned"
    lines = [
        f"{verb} {pruned.workflows} finished workflow(s) last changed more than "
        f"{older_than_days:g} day(s) ago" + (" (dry run: nothing was changed)" if dry_run else "")
    ]
    for table, rows in pruned.tables.items():
        note = ""
        if table == "workflow_checkpoints" and not delete_rows:
            note = f"  (rows kept: {ENV_PREFIX}RETENTION_DELETE_ROWS is false)"
        lines.append(f"{table}: {rows}{note}")
    return "\n".join(lines)


class Pruner:
    """This replica's retention loop (started by the engine when `days` is above 0)."""

    def __init__(
        self,
        *,
        pool: Pool,
        settings: RetentionSettings,
        metrics: Metrics,
        clock: Clock | None = None,
    ) -> None:
        self._pool = pool
        self._clock = SystemClock() if clock is None else clock
        self._settings = settings
        self._metrics = metrics
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="retention")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def round(self) -> Pruned | None:
        """Prune what is due now (see `prune_all`)."""
        settings = self._settings
        return await prune_all(
            self._pool.connection,
            older_than_seconds=settings.days * DAY_SECONDS,
            delete_rows=settings.delete_rows,
            batch_size=settings.batch_size,
            metrics=self._metrics,
            clock=self._clock,
        )

    async def _loop(self) -> None:
        while True:
            # Jitter keeps replicas started together from looking in lockstep.
            interval = self._settings.interval_seconds
            await self._clock.sleep(jittered(interval, random.random()))  # noqa: S311
            try:
                pruned = await self.round()
                if pruned is not None and pruned.workflows:
                    log.info("retention_pruned", workflows=pruned.workflows, **pruned.tables)
            except Exception as exc:
                if not is_transient(exc):
                    log.warning("retention_round_failed", error=repr(exc))
