"""What the graph's nodes call, behind narrow interfaces, and the factory that builds them.

`protocols` holds the interfaces (task source, planner, worker, verifier, context compressor)
and the values that cross them; `factory` builds the implementations the settings name. The
implementations are grouped by what they talk to:

- `tasks`: where a task comes from (StartWorkflow's own, the orchestrator's table, MCP);
- `model`: a model over an OpenAI-compatible endpoint (planner, verifier, command policy);
- `nodes`: worker nodes over the Worker API (registry, nodes file or table, the HTTP worker);
- at this level, the embedded ones: `embedded_planner`, `embedded_verifier`, `job_verifier`,
  `local_worker` (the local sandbox, `workflow_engine.sandbox`), `simulated_worker`, and
  `job_tracker`, which runs a workflow's dispatched jobs at the same time.
"""
