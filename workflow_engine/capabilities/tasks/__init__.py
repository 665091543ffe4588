"""Task sources: where a workflow's task comes from, as the engine's `TaskSpec`.

`inline_tasks` (StartWorkflow's own), `task_table` (the orchestrator's ``tasks`` table), `mcp_tasks`
(the orchestrator's MCP server), `stored_tasks` (the task as StartWorkflow stored it), and
`orchestrator_task`, the one mapping from the orchestrator's task to a `TaskSpec`;
`preferences` folds the preference layers a run uses.
"""
