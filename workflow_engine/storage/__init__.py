"""PostgreSQL: schema migrations, the lease, the row checkpointer, workflow rows, retries.

What the engine uses (`__all__`): `WorkflowStore`, the workflow rows' one facade; the row
checkpointer; the embedded server; `migrate`; `is_transient`, which errors are worth a retry;
and `orchestrator_nodes` and `orchestrator_tasks`, the orchestrator's tables as the engine
reads them.

Internal: the workflow rows are split by job behind `workflows.WorkflowStore`: `queries`
(reads), `tasks` (the stored task), `workflow_start`, `workflow_claims` and
`workflow_rows` (writes) with the steps they share (`row_writes`); `leases`, `pool`,
`group_commit` (the checkpointer's batched writes) and `retry` serve them.
"""

from workflow_engine.storage import orchestrator_nodes, orchestrator_tasks
from workflow_engine.storage.checkpointer import Checkpoint, RowCheckpointer
from workflow_engine.storage.embedded import EmbeddedPostgres, start_embedded_postgres
from workflow_engine.storage.migrations import migrate
from workflow_engine.storage.queries import MAX_HISTORY_EVENTS
from workflow_engine.storage.retry import is_transient
from workflow_engine.storage.workflows import WorkflowStore

__all__ = [
    "MAX_HISTORY_EVENTS",
    "Checkpoint",
    "EmbeddedPostgres",
    "RowCheckpointer",
    "WorkflowStore",
    "is_transient",
    "migrate",
    "orchestrator_nodes",
    "orchestrator_tasks",
    "start_embedded_postgres",
]
