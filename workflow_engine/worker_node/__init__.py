"""Our own worker node: `workflow-engine worker-node` serves the orchestrator's Worker API.

It runs each job through the local sandbox (`workflow_engine.sandbox`), in its own data
directory, once per job_id, so that anyone without the orchestrator's worker nodes can run the
whole system, and the engine can send jobs to other machines. `_server` is the process,
`_routes` its routes, `_run_request` the request checks and the answer's shape, `_job_runs`
the running jobs, `_problems` the error documents, `_connections` its connections' limits.
"""

from workflow_engine.errors import NodeInUse
from workflow_engine.worker_node._server import node_tls_context, serve_node

__all__ = [
    "NodeInUse",
    "node_tls_context",
    "serve_node",
]
