"""Versioned schema migrations, owned by the engine.

`MIGRATIONS` is a plain list: the index of an entry is its version. To change the schema, append
a new entry; never edit or reorder an applied one. `migrate` applies the missing ones in one
transaction, under an advisory lock, so that replicas starting together do not race.

The two orchestrator tables keep their prescribed columns and names (see
`shared/reference/orchestrator-contracts.md`). They are created only if absent, so the engine can
also run against an orchestrator database that already has them; the engine's own columns are
added with ``ADD COLUMN IF NOT EXISTS`` for the same reason.
"""

from __future__ import annotations

from typing import Any, LiteralString

import structlog
from psycopg import AsyncConnection

log = structlog.get_logger(__name__)

# Any fixed 64-bit number unlikely to collide with an application's own advisory locks.
_MIGRATION_LOCK_KEY = 0x77E6_0001

MIGRATIONS: list[LiteralString] = [
    # 0: the orchestrator's tables, plus the engine's columns and tables.
    """
    CREATE TABLE IF NOT EXISTS task_workflow_leases (
        id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
        task_id     uuid NOT NULL UNIQUE,
        lease_id    uuid NOT NULL,
        holder_id   text,
        expires_at  timestamptz,
        created_at  timestamptz NOT NULL DEFAULT now(),
        updated_at  timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX IF NOT EXISTS task_workflow_leases_expires_at_idx
        ON task_workflow_leases (expires_at) WHERE expires_at IS NOT NULL;
    -- Fencing token: grows on every change of holder, never shrinks.
    ALTER TABLE task_workflow_leases ADD COLUMN IF NOT EXISTS epoch bigint NOT NULL DEFAULT 1;

    CREATE TABLE IF NOT EXISTS workflow_checkpoints (
        id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
        task_id       uuid NOT NULL UNIQUE,
        state         jsonb NOT NULL,
        last_node_id  text,
        updated_at    timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX IF NOT EXISTS workflow_checkpoints_updated_at_idx
        ON workflow_checkpoints (updated_at);
    ALTER TABLE workflow_checkpoints
        ADD COLUMN IF NOT EXISTS run_id uuid,
        ADD COLUMN IF NOT EXISTS status text NOT NULL DEFAULT 'RUNNING',
        ADD COLUMN IF NOT EXISTS lease_epoch bigint NOT NULL DEFAULT 0,
        ADD COLUMN IF NOT EXISTS idempotency_key uuid,
        -- LangGraph's bookkeeping for the state in `state`: id, versions, versions seen, and
        -- the values of its internal channels. Together with `state` it is the checkpoint.
        ADD COLUMN IF NOT EXISTS checkpoint_id text,
        ADD COLUMN IF NOT EXISTS checkpoint jsonb,
        ADD COLUMN IF NOT EXISTS checkpoint_metadata jsonb,
        ADD COLUMN IF NOT EXISTS event_seq bigint NOT NULL DEFAULT 0,
        ADD COLUMN IF NOT EXISTS summary text NOT NULL DEFAULT '',
        ADD COLUMN IF NOT EXISTS error text NOT NULL DEFAULT '',
        ADD COLUMN IF NOT EXISTS created_at timestamptz NOT NULL DEFAULT now();
    CREATE INDEX IF NOT EXISTS workflow_checkpoints_status_idx ON workflow_checkpoints (status);

    -- The task as sent with StartWorkflow: what the inline task source loads.
    CREATE TABLE IF NOT EXISTS workflow_tasks (
        task_id     uuid PRIMARY KEY,
        spec        jsonb NOT NULL,
        created_at  timestamptz NOT NULL DEFAULT now()
    );

    -- One row per completed node and per status change, for WatchWorkflow.
    CREATE TABLE IF NOT EXISTS workflow_events (
        task_id     uuid NOT NULL,
        seq         bigint NOT NULL,
        run_id      uuid,
        kind        text NOT NULL,
        node_id     text,
        status      text NOT NULL,
        created_at  timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (task_id, seq)
    );

    -- Wake watchers in any replica; the payload is the task id only.
    CREATE OR REPLACE FUNCTION workflow_events_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('workflow_events', NEW.task_id::text);
        RETURN NULL;
    END;
    $$;
    DROP TRIGGER IF EXISTS workflow_events_notify ON workflow_events;
    CREATE TRIGGER workflow_events_notify AFTER INSERT ON workflow_events
        FOR EACH ROW EXECUTE FUNCTION workflow_events_notify();
    """,
    # 1: automatic recovery. Counts the times replicas took over a RUNNING workflow whose
    # runner vanished without progress since; a checkpoint write (progress) resets it.
    """
    ALTER TABLE workflow_checkpoints
        ADD COLUMN IF NOT EXISTS recovery_attempts integer NOT NULL DEFAULT 0;
    CREATE INDEX IF NOT EXISTS workflow_checkpoints_running_idx
        ON workflow_checkpoints (updated_at) WHERE status = 'RUNNING';
    """,
    # 2: approvals, overrides and inspection (issue 5).
    """
    ALTER TABLE workflow_checkpoints
        -- TaskSpec.metadata, copied at start so ListWorkflows can filter on it.
        ADD COLUMN IF NOT EXISTS user_id text NOT NULL DEFAULT '',
        ADD COLUMN IF NOT EXISTS project_id text NOT NULL DEFAULT '';
    CREATE INDEX IF NOT EXISTS workflow_checkpoints_list_idx
        ON workflow_checkpoints (updated_at DESC, task_id);
    ALTER TABLE workflow_events
        ADD COLUMN IF NOT EXISTS detail text NOT NULL DEFAULT '',
        ADD COLUMN IF NOT EXISTS actor text NOT NULL DEFAULT '';
    """,
    # 3: sharing the orchestrator's tables (issue 12). Only the engine's own columns are added
    # or changed; the orchestrator's keep their meaning, and rows of other writers are marked
    # as not the engine's.
    """
    ALTER TABLE workflow_checkpoints
        -- Rows the engine created. It never recovers, resumes, fails or rewrites any other.
        ADD COLUMN IF NOT EXISTS engine_owned boolean NOT NULL DEFAULT false,
        -- Another writer changed state or last_node_id since the engine last wrote them.
        ADD COLUMN IF NOT EXISTS changed_outside boolean NOT NULL DEFAULT false,
        -- Why the engine will not run the workflow until an operator decides; '' when it will.
        ADD COLUMN IF NOT EXISTS blocked_reason text NOT NULL DEFAULT '';
    -- Before this version every row with a run id was the engine's.
    UPDATE workflow_checkpoints SET engine_owned = true WHERE run_id IS NOT NULL;
    -- Another writer's row has no status of the engine's (the old default said RUNNING).
    ALTER TABLE workflow_checkpoints ALTER COLUMN status SET DEFAULT '';
    UPDATE workflow_checkpoints SET status = '' WHERE NOT engine_owned;

    -- Every statement of the engine that writes a row's state or last_node_id also appends to
    -- its events (event_seq grows). A change of either that does not is another writer's: the
    -- row is marked, and the engine holds the workflow for an operator. The WHEN clause is
    -- evaluated without calling the function, so the engine's own writes pay next to nothing.
    CREATE OR REPLACE FUNCTION workflow_checkpoints_changed_outside() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        NEW.changed_outside := true;
        RETURN NEW;
    END;
    $$;
    DROP TRIGGER IF EXISTS workflow_checkpoints_changed_outside ON workflow_checkpoints;
    CREATE TRIGGER workflow_checkpoints_changed_outside
        BEFORE UPDATE OF state, last_node_id ON workflow_checkpoints
        FOR EACH ROW
        WHEN (OLD.engine_owned AND NEW.event_seq = OLD.event_seq
              AND (NEW.state IS DISTINCT FROM OLD.state
                   OR NEW.last_node_id IS DISTINCT FROM OLD.last_node_id))
        EXECUTE FUNCTION workflow_checkpoints_changed_outside();

    ALTER TABLE task_workflow_leases
        -- The lease id of the engine's last acquire: while `lease_id` equals it, nobody else has
        -- taken the lease since (the orchestrator's acquire writes a lease id of its own).
        ADD COLUMN IF NOT EXISTS engine_lease_id uuid,
        -- Set when the engine released the lease for another replica to continue (a drain);
        -- a release by anyone else leaves it false and means stop.
        ADD COLUMN IF NOT EXISTS handed_over boolean NOT NULL DEFAULT false;
    UPDATE task_workflow_leases l
       SET engine_lease_id = l.lease_id,
           -- before this version the engine released a running workflow only to hand it over
           handed_over = l.holder_id IS NULL
      FROM workflow_checkpoints c
     WHERE c.task_id = l.task_id AND c.engine_owned;
    """,
    # 4: in-process watch fan-out. The notification names the event's sequence too, so a
    # process can tell its own writes (already served to its watchers) from anyone else's.
    """
    CREATE OR REPLACE FUNCTION workflow_events_notify() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('workflow_events', NEW.task_id::text || ':' || NEW.seq);
        RETURN NULL;
    END;
    $$;
    """,
    # 5: the lease's holder is the configured one, whichever engine process holds it; and why
    # a run stopped without ending (issue 47).
    """
    ALTER TABLE task_workflow_leases
        -- Which engine process took the lease (`Settings.process_name`): several processes of
        -- one engine share its holder id, and a process may take over only its own lease.
        ADD COLUMN IF NOT EXISTS holder_process text;
    ALTER TABLE workflow_checkpoints
        -- Why the workflow's run stopped although it did not end (its lease was released or
        -- taken by another writer); '' when it runs or ended. A resume clears it.
        ADD COLUMN IF NOT EXISTS stopped_reason text NOT NULL DEFAULT '';
    """,
    # 6: which state format, and which engine, wrote the row (issue 51; see
    # `domain.state_format`). The default stays 1 for good: a row an engine inserts without
    # knowing the column is a format-1 row, as is every row written before it existed.
    """
    ALTER TABLE workflow_checkpoints
        ADD COLUMN IF NOT EXISTS state_format integer NOT NULL DEFAULT 1,
        ADD COLUMN IF NOT EXISTS engine_version text NOT NULL DEFAULT '';
    """,
    # 7: retention (issue 51). A finished workflow's events are pruned once it is old, all but
    # the one that ended it; `pruned_seq` is its `event_seq` then, so a row is due again only
    # if it gained events since. The index finds the due rows (key true) and, when the rows
    # themselves go too, the pruned ones (key false) without walking anyone else's.
    """
    ALTER TABLE workflow_checkpoints
        ADD COLUMN IF NOT EXISTS pruned_seq bigint NOT NULL DEFAULT 0;
    CREATE INDEX IF NOT EXISTS workflow_checkpoints_finished_idx
        ON workflow_checkpoints ((event_seq > pruned_seq), updated_at)
     WHERE engine_owned AND status IN ('SUCCEEDED', 'FAILED', 'CANCELLED');
    """,
    # 8: time as an input (issue 52). `wake_at` is when a waiting workflow must be looked at
    # again without anyone asking (its approval request expires, or its deadline passes); it is
    # written with the checkpoint that begins the wait, so it survives every restart, and the
    # timer sweep of whichever replica is alive finds the due rows by this index.
    """
    ALTER TABLE workflow_checkpoints
        ADD COLUMN IF NOT EXISTS wake_at timestamptz;
    CREATE INDEX IF NOT EXISTS workflow_checkpoints_wake_idx
        ON workflow_checkpoints (wake_at)
     WHERE engine_owned AND wake_at IS NOT NULL;
    """,
    # 9: schedules (issue 52). A schedule starts a workflow from a template at each slot of
    # its calendar; `next_fire_time` is stored before anything waits for it, and a slot's
    # workflow names its schedule and slot (its task id is derived from both).
    """
    CREATE TABLE IF NOT EXISTS workflow_schedules (
        schedule_id      text PRIMARY KEY,
        project_id       text NOT NULL DEFAULT '',
        user_id          text NOT NULL DEFAULT '',
        cron             text NOT NULL,
        time_zone        text NOT NULL DEFAULT '',
        task             jsonb,
        template_task_id text NOT NULL DEFAULT '',
        overlap          text NOT NULL,
        catch_up         text NOT NULL,
        paused           boolean NOT NULL DEFAULT false,
        next_fire_time   timestamptz,
        last_fire_time   timestamptz,
        last_task_id     text NOT NULL DEFAULT '',
        created_by       text NOT NULL DEFAULT '',
        created_at       timestamptz NOT NULL DEFAULT now(),
        updated_at       timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX IF NOT EXISTS workflow_schedules_due_idx
        ON workflow_schedules (next_fire_time) WHERE NOT paused;
    ALTER TABLE workflow_checkpoints
        ADD COLUMN IF NOT EXISTS schedule_id text,
        ADD COLUMN IF NOT EXISTS schedule_slot timestamptz;
    CREATE INDEX IF NOT EXISTS workflow_checkpoints_schedule_idx
        ON workflow_checkpoints (schedule_id, updated_at) WHERE schedule_id IS NOT NULL;
    """,
    # 10: an id space per tenant for schedules (issue 61). A schedule created under an id that
    # another tenant's schedule holds is stored under a key of its own (`schedule_id`, derived
    # from its creator's scope and the id) and keeps the id its creator named in `public_id`
    # (NULL for every other schedule: its key is its id).
    """
    ALTER TABLE workflow_schedules ADD COLUMN IF NOT EXISTS public_id text;
    CREATE INDEX IF NOT EXISTS workflow_schedules_public_idx
        ON workflow_schedules (public_id) WHERE public_id IS NOT NULL;
    """,
]


async def migrate(conn: AsyncConnection[Any], *, up_to: int | None = None) -> int:
    """Apply every migration not yet applied (the first `up_to` only, when given: a schema of
    an earlier version, for tests); return how many the schema now has."""
    wanted = len(MIGRATIONS) if up_to is None else up_to
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_KEY,))
        await conn.execute(
            """
            CREATE TABLE IF NOT EXISTS workflow_engine_migrations (
                version     integer PRIMARY KEY,
                applied_at  timestamptz NOT NULL DEFAULT now()
            )
            """
        )
        cur = await conn.execute(
            "SELECT coalesce(max(version) + 1, 0) FROM workflow_engine_migrations"
        )
        row = await cur.fetchone()
        current = int(row[0]) if row else 0
        for version in range(current, wanted):
            await conn.execute(MIGRATIONS[version])
            await conn.execute(
                "INSERT INTO workflow_engine_migrations (version) VALUES (%s)", (version,)
            )
            log.info("migration_applied", version=version)
    return max(current, wanted)
