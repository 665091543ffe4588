"""Our own worker node: `workflow-engine worker-node` serves the orchestrator's Worker API.

It runs each job through the local sandbox (`workflow_engine.sandbox`), in its own data
directory, once per job_id, so that anyone without the orchestrator's worker nodes can run the
whole system, and the engine can send jobs to other machines. `server` is the process,
`routes` its routes, `run_request` the request checks and the answer's shape, `job_runs` the
running jobs, `problems` the error documents.
"""

from workflow_engine.errors import NodeInUse
from workflow_engine.worker_node._server import node_tls_context, serve_node

__all__ = ["NodeInUse", "node_tls_context", "serve_node"]
