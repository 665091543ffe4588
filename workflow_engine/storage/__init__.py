"""PostgreSQL: schema migrations, the lease, the row checkpointer, workflow rows, retries.

Workflow rows are split by job (`records`, `workflow_rows`, `queries`, `tasks`) behind one
facade, `workflows.WorkflowStore`.
"""
