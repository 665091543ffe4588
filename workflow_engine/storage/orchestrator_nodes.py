"""The orchestrator's worker-node tables, ``nodes`` and ``node_capabilities``, read (never
written) so that the ``nodes`` worker can send jobs to the orchestrator's own worker nodes.

Their ORM creates the tables (see docs/orchestrator.md); the engine's migrations do not.
Each node's row is read whole, as JSON (``to_jsonb``), so optional columns (``deleted_at`` of
their newer schema, ``config_ack_status``) arrive when present and nothing breaks when absent,
with its latest capability snapshot (by ``reported_at``) added as ``capability_snapshot`` and
``capability_reported_at``. Soft-deleted rows (``deleted_at`` set) of either table are left
out. `capabilities.workers._nodes_table` decides which nodes are usable; the engine lends
`read_nodes` to it as a plain callable (capabilities do not import storage).

The rows carry each node's bearer token: nothing here logs them.
"""

from __future__ import annotations

from typing import Any

from workflow_engine.domain.values import JsonObject
from workflow_engine.storage._pool import Connection, Pool, on_connection

# Their tables, as the search path finds them, with the columns a node is read from (a `nodes`
# table of some other application is not theirs), and whether snapshots are soft-deleted.
_TABLES = """
SELECT
  (SELECT count(*) FROM pg_attribute
    WHERE attrelid = to_regclass('nodes') AND NOT attisdropped
      AND attname IN ('id', 'node_slug', 'status', 'worker_api_target_url',
                      'worker_api_bearer_token')) = 5
  AND
  (SELECT count(*) FROM pg_attribute
    WHERE attrelid = to_regclass('node_capabilities') AND NOT attisdropped
      AND attname IN ('node_id', 'reported_at', 'capability_snapshot')) = 3,
  EXISTS (SELECT FROM pg_attribute
    WHERE attrelid = to_regclass('node_capabilities') AND NOT attisdropped
      AND attname = 'deleted_at')
"""

# The latest snapshot per node, as their own `GetLatestNodeCapabilitySnapshot` picks it (their
# `node_id` index, newest `reported_at` first). The nodes table is small (a row per node), so
# its soft delete is read from the row's JSON, which works with or without the column; the
# snapshots are many (one per report), so their `deleted_at` is a real column condition.
_SELECT_NODES = """
SELECT to_jsonb(n) || jsonb_build_object(
         'capability_snapshot', s.capability_snapshot,
         'capability_reported_at', s.reported_at)
  FROM nodes n
  LEFT JOIN LATERAL (
    SELECT c.capability_snapshot, c.reported_at FROM node_capabilities c
     WHERE c.node_id = n.id {snapshot_filter}
     ORDER BY c.reported_at DESC NULLS LAST
     LIMIT 1
  ) s ON true
 WHERE to_jsonb(n) ->> 'deleted_at' IS NULL
 ORDER BY n.node_slug
"""
_SELECT_NODES_PLAIN = _SELECT_NODES.format(snapshot_filter="")
_SELECT_NODES_SOFT_DELETE = _SELECT_NODES.format(snapshot_filter="AND c.deleted_at IS NULL")


async def read_nodes(pool: Pool) -> list[JsonObject] | None:
    """Every node row that is not soft-deleted, as JSON (column: value) with its latest
    capability snapshot; `None` when the database has no such tables."""

    async def read(conn: Connection) -> Any:
        cur = await conn.execute(_TABLES)
        found = await cur.fetchone()
        if not found or not found[0]:
            return None
        cur = await conn.execute(_SELECT_NODES_SOFT_DELETE if found[1] else _SELECT_NODES_PLAIN)
        return [row[0] for row in await cur.fetchall()]

    rows: list[JsonObject] | None = await on_connection(pool, read)
    return rows
