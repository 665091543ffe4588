"""Where a job runs: the `Worker` implementations the factory chooses between.

`_local` runs jobs in the local sandbox (`workflow_engine.sandbox`; the default, and what a
worker node runs); `_simulated` answers in-process (benchmarks, dry runs); `_http` runs each job
on a worker node over the orchestrator's Worker API, on a node that `_registry` picks (labels,
health, load), the nodes coming from `_nodes_file` or the orchestrator's table
(`_nodes_table`); `_worker_api` maps the wire's requests and answers to the engine's.

"Worker node" always means such a machine (or `workflow-engine worker-node`,
`workflow_engine.worker_node`); a bare "node" is one of the graph's.

What the factory and the worker node use (`__all__`): the workers, the nodes table and the
file's loader.
"""

from workflow_engine.capabilities.workers._http import HttpWorker
from workflow_engine.capabilities.workers._local import LocalSandboxWorker
from workflow_engine.capabilities.workers._nodes_file import load_nodes_file
from workflow_engine.capabilities.workers._nodes_table import NodeTable
from workflow_engine.capabilities.workers._simulated import SimulatedWorker

__all__ = [
    "HttpWorker",
    "LocalSandboxWorker",
    "NodeTable",
    "SimulatedWorker",
    "load_nodes_file",
]
