"""The ``nodes`` worker: jobs on worker nodes over the orchestrator's Worker API.

`http_worker` runs each job on a node that `node_registry` picks (labels, health, load); the
nodes come from `nodes_file` or the orchestrator's table (`node_table`); `worker_api` maps
the wire's requests and answers to the engine's.

What the factory uses (`__all__`): the worker, the table and the file's loader;
`node_registry` and `worker_api` are internal.
"""

from workflow_engine.capabilities.workers._http import HttpWorker
from workflow_engine.capabilities.workers._nodes_file import load_nodes_file
from workflow_engine.capabilities.workers._nodes_table import NodeTable

__all__ = ["HttpWorker", "NodeTable", "load_nodes_file"]
