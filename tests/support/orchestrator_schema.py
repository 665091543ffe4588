"""The orchestrator's tables exactly as its ORM (GORM AutoMigrate) creates them.

Restated from `shared/reference/orchestrator-contracts.md`, "Their tables as their ORM creates
them": no column defaults (their application fills `id`, `created_at`, `updated_at`), columns
nullable unless noted, indexes named ``idx_<table>_<column>``, and no foreign keys. Two variants
add what their spec or their newer branch has on top:

- ``fks``: the foreign keys their spec asks for (``task_id -> tasks.id``);
- ``soft_delete``: their `mvp/phase-2` branch: ``deleted_at`` on every table (indexed),
  ``created_at`` on `workflow_checkpoints`, ``created_at`` and ``updated_at`` on
  `node_capabilities`, ``tasks.planning_state``.

The worker-node tables (``nodes``, ``node_capabilities``) are as their `models.Node` and
`models.NodeCapability` declare them (every column of the model, not only those the engine
reads); `insert_node` and `insert_snapshot` write rows as their handlers do.

`create_orchestrator_db` makes a fresh database with one variant and, unless told otherwise,
the engine's migrations applied after it (their tables first, as in their deployment).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import psycopg
from psycopg.conninfo import make_conninfo
from psycopg_pool import AsyncConnectionPool

VARIANTS: Sequence[str] = ("plain", "fks", "soft_delete")

_TABLES = """
CREATE TABLE tasks (
    id                  uuid PRIMARY KEY,
    created_by          uuid,
    project_id          uuid,
    plan_id             uuid,
    status              text,
    closed              boolean,
    prompt              text,
    acceptance_criteria jsonb,
    summary             text,
    metadata            jsonb,
    created_at          timestamptz,
    updated_at          timestamptz
);
CREATE INDEX idx_tasks_created_by ON tasks (created_by);
CREATE INDEX idx_tasks_project_id ON tasks (project_id);
CREATE INDEX idx_tasks_plan_id ON tasks (plan_id);
CREATE INDEX idx_tasks_status ON tasks (status);
CREATE INDEX idx_tasks_closed ON tasks (closed);

CREATE TABLE workflow_checkpoints (
    id            uuid PRIMARY KEY,
    task_id       uuid NOT NULL,
    state         jsonb,
    last_node_id  text,
    updated_at    timestamptz
);
CREATE UNIQUE INDEX idx_workflow_checkpoints_task_id ON workflow_checkpoints (task_id);
CREATE INDEX idx_workflow_checkpoints_updated_at ON workflow_checkpoints (updated_at);

CREATE TABLE task_workflow_leases (
    id          uuid PRIMARY KEY,
    task_id     uuid NOT NULL,
    lease_id    uuid NOT NULL,
    holder_id   text,
    expires_at  timestamptz,
    created_at  timestamptz,
    updated_at  timestamptz
);
CREATE UNIQUE INDEX idx_task_workflow_leases_task_id ON task_workflow_leases (task_id);
CREATE INDEX idx_task_workflow_leases_expires_at ON task_workflow_leases (expires_at);

CREATE TABLE nodes (
    id                       uuid PRIMARY KEY,
    node_slug                text,
    status                   text,
    capability_hash          text,
    config_version           text,
    worker_api_target_url    text,
    worker_api_bearer_token  text,
    config_ack_at            timestamptz,
    config_ack_status        text,
    config_ack_error         text,
    last_seen_at             timestamptz,
    last_capability_at       timestamptz,
    metadata                 jsonb,
    created_at               timestamptz,
    updated_at               timestamptz
);
CREATE UNIQUE INDEX idx_nodes_node_slug ON nodes (node_slug);
CREATE INDEX idx_nodes_status ON nodes (status);

CREATE TABLE node_capabilities (
    id                   uuid PRIMARY KEY,
    node_id              uuid,
    reported_at          timestamptz,
    capability_snapshot  jsonb
);
CREATE INDEX idx_node_capabilities_node_id ON node_capabilities (node_id);
"""

_FOREIGN_KEYS = """
ALTER TABLE workflow_checkpoints
    ADD CONSTRAINT fk_workflow_checkpoints_task FOREIGN KEY (task_id) REFERENCES tasks (id);
ALTER TABLE task_workflow_leases
    ADD CONSTRAINT fk_task_workflow_leases_task FOREIGN KEY (task_id) REFERENCES tasks (id);
"""

_SOFT_DELETE = """
ALTER TABLE tasks ADD COLUMN deleted_at timestamptz;
ALTER TABLE tasks ADD COLUMN planning_state text NOT NULL DEFAULT 'draft';
CREATE INDEX idx_tasks_deleted_at ON tasks (deleted_at);
ALTER TABLE workflow_checkpoints ADD COLUMN deleted_at timestamptz;
ALTER TABLE workflow_checkpoints ADD COLUMN created_at timestamptz;
CREATE INDEX idx_workflow_checkpoints_deleted_at ON workflow_checkpoints (deleted_at);
ALTER TABLE task_workflow_leases ADD COLUMN deleted_at timestamptz;
CREATE INDEX idx_task_workflow_leases_deleted_at ON task_workflow_leases (deleted_at);
ALTER TABLE nodes ADD COLUMN deleted_at timestamptz;
CREATE INDEX idx_nodes_deleted_at ON nodes (deleted_at);
ALTER TABLE node_capabilities ADD COLUMN created_at timestamptz;
ALTER TABLE node_capabilities ADD COLUMN updated_at timestamptz;
ALTER TABLE node_capabilities ADD COLUMN deleted_at timestamptz;
CREATE INDEX idx_node_capabilities_deleted_at ON node_capabilities (deleted_at);
"""


def ddl(variant: str) -> str:
    """The statements that create the orchestrator's tables in `variant`."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")
    return _TABLES + {"plain": "", "fks": _FOREIGN_KEYS, "soft_delete": _SOFT_DELETE}[variant]


async def create_orchestrator_db(admin_url: str, variant: str, *, migrate: bool = True) -> str:
    """A fresh database holding the orchestrator's tables (then the engine's migrations, when
    `migrate`); returns its name. The caller drops it."""
    from workflow_engine.storage._database import run_migrations

    name = f"orch_{variant}_{uuid.uuid4().hex[:10]}"
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {name}")
    url = make_conninfo(admin_url, dbname=name)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(ddl(variant))  # type: ignore[arg-type]
    if migrate:
        async with AsyncConnectionPool(url, kwargs={"autocommit": True}, min_size=1) as pool:
            await run_migrations(pool)
    return name


async def insert_task(
    conn: psycopg.AsyncConnection[object],
    *,
    task_id: str | None = None,
    prompt: str = "$ echo hello",
    acceptance_criteria: object = None,
    summary: str = "a task",
    metadata: object = None,
    closed: bool = False,
    status: str = "pending",
    project_id: str | None = None,
    created_by: str | None = None,
) -> str:
    """Insert a task row the way their ORM does (every column given by the application)."""
    from psycopg.types.json import Jsonb

    task_id = task_id or str(uuid.uuid4())
    await conn.execute(
        """
        INSERT INTO tasks (id, created_by, project_id, plan_id, status, closed, prompt,
                           acceptance_criteria, summary, metadata, created_at, updated_at)
        VALUES (%s, %s, %s, NULL, %s, %s, %s, %s, %s, %s, now(), now())
        """,
        (
            task_id,
            created_by,
            project_id,
            status,
            closed,
            prompt,
            None if acceptance_criteria is None else Jsonb(acceptance_criteria),
            summary,
            None if metadata is None else Jsonb(metadata),
        ),
    )
    return task_id


async def insert_task_at(url: str, **row: object) -> str:
    """`insert_task` on a connection of its own to `url`."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        return await insert_task(conn, **row)  # type: ignore[arg-type]


async def insert_node(
    conn: psycopg.AsyncConnection[object],
    slug: str,
    *,
    url: str | None,
    token: str | None,
    status: str = "active",
    config_ack_status: str | None = "applied",
    metadata: object = None,
) -> str:
    """A node row as their registration, activation and configuration acknowledgement leave
    it (`CreateNode`, `UpdateNodeStatus`, `UpdateNodeWorkerAPIConfig`, `UpdateNodeConfigAck`)."""
    from psycopg.types.json import Jsonb

    node_id = str(uuid.uuid4())
    await conn.execute(
        """
        INSERT INTO nodes (id, node_slug, status, worker_api_target_url, worker_api_bearer_token,
                           config_ack_at, config_ack_status, last_seen_at, metadata, created_at,
                           updated_at)
        VALUES (%s, %s, %s, %s, %s, now(), %s, now(), %s, now(), now())
        """,
        (
            node_id,
            slug,
            status,
            url,
            token,
            config_ack_status,
            None if metadata is None else Jsonb(metadata),
        ),
    )
    return node_id


async def insert_snapshot(
    conn: psycopg.AsyncConnection[object],
    node_id: str,
    snapshot: object,
    *,
    seconds_ago: float = 0,
) -> None:
    """A capability report as their `SaveNodeCapabilitySnapshot` stores it, `seconds_ago`."""
    from psycopg.types.json import Jsonb

    await conn.execute(
        """
        INSERT INTO node_capabilities (id, node_id, reported_at, capability_snapshot)
        VALUES (%s, %s, now() - make_interval(secs => %s), %s)
        """,
        (str(uuid.uuid4()), node_id, seconds_ago, Jsonb(snapshot)),
    )
