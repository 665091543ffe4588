"""PostgreSQL: the database and its pool, schema migrations, the lease, the row checkpointer,
workflow rows, retries.

Each module owns its SQL and is called directly, with the engine's pool: `workflow_rows`
cancels and sets statuses, `workflow_start` starts, `workflow_claims` claims (with the steps
they share in `row_writes`); `queries` reads rows, events and pages; `tasks` keeps the task
spec; `leases` takes, renews, releases and checks a runner's lease (on a connection, see
`pool.on_connection`); `checkpointer` writes the per-node checkpoint (batched by
`group_commit`); `database` opens it all (the embedded server of `embedded` when no URL is
set); `orchestrator_nodes` and `orchestrator_tasks` read the orchestrator's tables.

What other packages use by name (`__all__`): the row checkpointer, the embedded server,
`migrate`, `is_transient` (which errors are worth a retry), and the modules above.
"""

from workflow_engine.storage import (
    _leases as leases,
)
from workflow_engine.storage import (
    _orchestrator_nodes as orchestrator_nodes,
)
from workflow_engine.storage import (
    _orchestrator_tasks as orchestrator_tasks,
)
from workflow_engine.storage import (
    _queries as queries,
)
from workflow_engine.storage import (
    _tasks as tasks,
)
from workflow_engine.storage import (
    _workflow_rows as workflow_rows,
)
from workflow_engine.storage._checkpointer import Checkpoint, RowCheckpointer
from workflow_engine.storage._embedded import EmbeddedPostgres, start_embedded_postgres
from workflow_engine.storage._migrations import migrate
from workflow_engine.storage._queries import MAX_HISTORY_EVENTS
from workflow_engine.storage._retry import is_transient

__all__ = [
    "MAX_HISTORY_EVENTS",
    "Checkpoint",
    "EmbeddedPostgres",
    "RowCheckpointer",
    "is_transient",
    "leases",
    "migrate",
    "orchestrator_nodes",
    "orchestrator_tasks",
    "queries",
    "start_embedded_postgres",
    "tasks",
    "workflow_rows",
]
