"""PostgreSQL: the database and its pool, schema migrations, the lease, the row checkpointer,
workflow rows, retries.

Each module owns its SQL and is called directly, with the engine's pool. Its public modules
are the other packages' way in, one per table or concern: `workflow_rows` cancels and sets
statuses, `queries` reads rows, events and pages, `tasks` keeps the task spec, `leases` takes,
renews, releases and checks a runner's lease (on a connection, see `on_connection`),
`schedules` keeps schedules, and `orchestrator_nodes` and `orchestrator_tasks` read the
orchestrator's tables. Its own: `_workflow_start` starts and `_workflow_claims` claims (with
the steps they share in `_row_writes`); `_checkpointer` writes the per-node checkpoint
(batched by `_group_commit`), and `_langgraph_saver` hands the same row to LangGraph's own loop
(a `BaseCheckpointSaver` the engine's runs do not use); `_database` opens it all (the embedded
server of `_embedded` when no URL is set); `_migrations`, `_retention`, `_retry`, `_pool`.

What other packages use by name (`__all__`): those modules, the row checkpointer, the pool,
the embedded server, the migrations, retention's batches, and `is_transient` (which errors are
worth a retry).
"""

from workflow_engine.storage import (
    leases,
    orchestrator_nodes,
    orchestrator_tasks,
    queries,
    schedules,
    tasks,
    workflow_rows,
)
from workflow_engine.storage._checkpointer import Checkpoint, RowCheckpointer
from workflow_engine.storage._database import (
    database_url,
    migrate_database,
    open_pool,
    run_migrations,
)
from workflow_engine.storage._embedded import EmbeddedPostgres, start_embedded_postgres
from workflow_engine.storage._migrations import migrate
from workflow_engine.storage._pool import Connection, Pool, on_connection
from workflow_engine.storage._retention import Pruned, count_due, prune_batch
from workflow_engine.storage._retry import is_transient
from workflow_engine.storage.queries import MAX_HISTORY_EVENTS

__all__ = [
    "MAX_HISTORY_EVENTS",
    "Checkpoint",
    "Connection",
    "EmbeddedPostgres",
    "Pool",
    "Pruned",
    "RowCheckpointer",
    "count_due",
    "database_url",
    "is_transient",
    "leases",
    "migrate",
    "migrate_database",
    "on_connection",
    "open_pool",
    "orchestrator_nodes",
    "orchestrator_tasks",
    "prune_batch",
    "queries",
    "run_migrations",
    "schedules",
    "start_embedded_postgres",
    "tasks",
    "workflow_rows",
]
