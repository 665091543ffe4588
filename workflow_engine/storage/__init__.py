"""PostgreSQL: schema migrations, the lease, the row checkpointer, workflow rows, retries."""
