"""The checkpoint write finds its rows by index, however many other workflows the tables hold.

The batch statement's input is a JSON array, which PostgreSQL estimates at 100 rows whatever
it holds; joined to the lease table as a plain join, that estimate made a scan of the whole
table look cheaper than 100 index probes once the table held a few thousand rows, and every
checkpoint write then read every lease (and, with stale statistics, every checkpoint row).
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from tests.support.helpers import new_task_id
from workflow_engine.graph.state import initial_state
from workflow_engine.storage import workflow_rows
from workflow_engine.storage._group_commit import WRITE_BATCH, CheckpointRow, batch_params

OTHERS = 3000  # workflows of other holders, their leases live

FILL = f"""
INSERT INTO task_workflow_leases
    (id, task_id, lease_id, holder_id, expires_at, created_at, updated_at, epoch)
SELECT gen_random_uuid(), t, gen_random_uuid(), 'other', now() + interval '1 hour',
       now(), now(), 1
  FROM (SELECT gen_random_uuid() AS t FROM generate_series(1, {OTHERS})) g;
INSERT INTO workflow_checkpoints
    (id, task_id, state, last_node_id, updated_at, created_at, status, engine_owned)
SELECT gen_random_uuid(), task_id,
       -- about 700 bytes of state each, different in every row (the subquery refers to
       -- the row, so it runs for each)
       jsonb_build_object('notes', (SELECT string_agg(md5(random()::text), '')
                                      FROM generate_series(1, 20 + (task_id IS NULL)::int))),
       'plan_steps', now(), now(), 'RUNNING', true
  FROM task_workflow_leases WHERE holder_id = 'other';
ANALYZE task_workflow_leases;
ANALYZE workflow_checkpoints;
"""

SEQ_SCANS = """
SELECT relname, seq_scan FROM pg_stat_xact_user_tables
 WHERE relname IN ('task_workflow_leases', 'workflow_checkpoints')
"""


def row(task_id: str, epoch: int, node: str, *, release: bool = False) -> CheckpointRow:
    return CheckpointRow(
        task_id=task_id,
        holder_id="A",
        epoch=epoch,
        run_id=(run_id := str(uuid.uuid4())),
        state=dict(initial_state(task_id, run_id)),
        node=node,
        status="SUCCEEDED" if release else "RUNNING",
        checkpoint_id=str(uuid.uuid4()),
        checkpoint={},
        metadata={},
        summary="",
        error="",
        release=release,
    )


async def test_checkpoint_writes_scan_no_whole_table(db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(FILL)
    ours: list[tuple[str, int]] = []  # our workflows: task id, epoch
    async with AsyncConnectionPool(db_url, kwargs={"autocommit": True}, min_size=1) as pool:
        for _ in range(3):
            task_id = new_task_id()
            run_id = str(uuid.uuid4())
            started = await workflow_rows.create(
                pool,
                process="",
                task_id=task_id,
                run_id=run_id,
                holder_id="A",
                idempotency_key=None,
                ttl_seconds=60,
                spec={},
                initial_state=dict(initial_state(task_id, run_id)),
            )
            ours.append((task_id, started.lease.epoch))

    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        # Counted as a difference within one transaction: a backend keeps its counts from
        # earlier transactions until it reports them (at most once a second), and behind a
        # pooler this connection's backend may be the one that just filled the tables.
        before = dict(await (await conn.execute(SEQ_SCANS)).fetchall())
        answers: list[Any] = []
        # Enough executions for psycopg to prepare the statement and PostgreSQL to settle on
        # the plan it then keeps: a flaw in that plan shows after the first five.
        for n, node in enumerate(["load_task_context", "plan_steps"] * 5):
            last = n == 9
            rows = [row(t, e, node, release=last and i == 0) for i, (t, e) in enumerate(ours)]
            cur = await conn.execute(WRITE_BATCH, batch_params(rows))
            answers += [a[1] for a in await cur.fetchall()]
        after = dict(await (await conn.execute(SEQ_SCANS)).fetchall())
        await conn.commit()
    scans = {table: after[table] - before.get(table, 0) for table in after}

    assert answers == ["written"] * 30
    assert scans == {"task_workflow_leases": 0, "workflow_checkpoints": 0}
