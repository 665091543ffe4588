"""The ``nodes`` worker: jobs on worker nodes over the orchestrator's Worker API.

`http_worker` runs each job on a node that `node_registry` picks (labels, health, load); the
nodes come from `nodes_file` or the orchestrator's table (`node_table`); `worker_api` maps
the wire's requests and answers to the engine's.
"""
