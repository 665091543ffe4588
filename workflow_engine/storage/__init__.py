"""PostgreSQL: the database and its pool, schema migrations, the lease, the row checkpointer,
workflow rows, retries.

Each module owns its SQL and is called directly, with the engine's pool: `workflow_rows` starts,
claims, cancels and sets statuses; `queries` reads rows, events and pages; `tasks` keeps the
task spec; `leases` takes, renews, releases and checks a runner's lease (on a connection, see
`pool.on_connection`); `checkpointer` writes the per-node checkpoint; `database` opens it all.
"""
