"""Every clause of every fenced statement has a case that fails without it.

The fence ("this holder, this epoch, not expired") is one fragment (`leases.HELD`,
`leases.FENCE`) that every fenced statement shares, so a test of any one statement catches a
clause dropped from the fragment, but not one dropped from a single statement (inlined or edited
there alone). Here each (statement, clause) pair has a case of its own: the one situation that
clause alone guards, tried through the statement's real function, which must refuse it and
change nothing. `test_without_its_clause_the_case_gets_through` proves each case: it removes
exactly that clause from the real statement and expects the same situation to get through.
`test_every_fenced_statement_is_in_the_table` finds the statements in `workflow_engine.storage`
that check a holder and an epoch, so a new fenced statement cannot go without cases.

Situations (a runner "A" tries with a stale fence):
  another holder  B took the lease over; A's fence names B's epoch (only the holder differs)
  older epoch     A re-took its own lease; A's fence names the epoch before (only it differs)
  expired         A's lease expired, nobody took it (only the expiry differs)
  resent          A wrote checkpoint X at its first epoch, re-took its lease, lost it again,
                  and sends X under the newer fence: the row holds X, but not from this epoch,
                  so it is not a retry of a write that landed: the answer is "lost"

Release has no expiry clause on purpose: a runner may release its own expired lease (see
`leases.HELD`).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

import workflow_engine.storage
from tests.support import database
from tests.support.helpers import new_task_id
from workflow_engine.domain import Fence
from workflow_engine.graph.state import initial_state
from workflow_engine.storage import _group_commit as group_commit
from workflow_engine.storage import leases, workflow_rows
from workflow_engine.storage._group_commit import CheckpointRow, GroupCommitter

TTL = 30


@dataclass(frozen=True)
class Attempt:
    """What the stale runner tries: its fence, and the checkpoint it sends (for a write)."""

    fence: Fence
    checkpoint_id: str = field(default_factory=lambda: str(uuid.uuid4()))


Pool = AsyncConnectionPool[Any]
Situation = Callable[[Pool], Awaitable[Attempt]]


@dataclass(frozen=True)
class Statement:
    """A fenced statement: the module constant its function executes, and a try of it."""

    module: ModuleType
    constant: str
    #: Runs the statement's real function for an attempt; whether it got through.
    attempt: Callable[[Pool, Attempt], Awaitable[bool]]

    @property
    def sql(self) -> str:
        text = getattr(self.module, self.constant)
        assert isinstance(text, str)
        return text

    def __str__(self) -> str:
        return self.constant


# How each statement is tried, through the function that executes it.


async def _renew(pool: Pool, attempt: Attempt) -> bool:
    async with pool.connection() as conn:
        return await leases.renew(conn, attempt.fence, TTL) is not None


async def _release(pool: Pool, attempt: Attempt) -> bool:
    async with pool.connection() as conn:
        return await leases.release(conn, attempt.fence)


async def _holds(pool: Pool, attempt: Attempt) -> bool:
    async with pool.connection() as conn:
        return await leases.holds(conn, attempt.fence)


async def _lock_fenced(pool: Pool, attempt: Attempt) -> bool:
    async with pool.connection() as conn, conn.transaction():  # as a status change takes it
        return await leases.lock_fenced(conn, attempt.fence)


async def _write(pool: Pool, attempt: Attempt) -> bool:
    fence = attempt.fence
    row = CheckpointRow(
        task_id=fence.task_id,
        holder_id=fence.holder_id,
        epoch=fence.epoch,
        run_id=fence.run_id,
        state=dict(initial_state(fence.task_id, fence.run_id)),
        node="plan_steps",
        status="RUNNING",
        checkpoint_id=attempt.checkpoint_id,
        checkpoint={},
        metadata={},
        summary="",
        error="",
    )
    committer = GroupCommitter(pool)
    try:
        outcome = await committer.write(row)
    finally:
        await committer.close()
    assert outcome.written in ("written", "lost")  # "outside" would be some other refusal
    return outcome.written == "written"


RENEW = Statement(leases, "RENEW", _renew)
RELEASE = Statement(leases, "RELEASE", _release)
FENCE_HOLDS = Statement(leases, "FENCE_HOLDS", _holds)
LOCK_FENCED = Statement(leases, "LOCK_FENCED", _lock_fenced)
WRITE_BATCH = Statement(group_commit, "WRITE_BATCH", _write)


# The situations, each built with the engine's own functions from a workflow A started.


async def _start_as_a(pool: Pool) -> Fence:
    task_id = new_task_id()
    run_id = str(uuid.uuid4())
    started = await workflow_rows.create(
        pool,
        process="",
        task_id=task_id,
        run_id=run_id,
        holder_id="A",
        idempotency_key=None,
        ttl_seconds=TTL,
        spec={},
        initial_state=dict(initial_state(task_id, run_id)),
    )
    assert started.lease is not None
    return Fence(task_id, started.run_id, "A", started.lease.epoch)


async def _expire(pool: Pool, task_id: str) -> None:
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE task_workflow_leases SET expires_at = now() - interval '1 second'"
            " WHERE task_id = %s",
            (task_id,),
        )


async def _take(pool: Pool, task_id: str, holder_id: str) -> int:
    """`holder_id` claims the workflow to resume it, as a replica or a restarted runner (of the
    same holder) does, taking the lease; the lease's new epoch."""
    claim = await workflow_rows.claim_for_resume(
        pool, process="", task_id=task_id, holder_id=holder_id, ttl_seconds=TTL
    )
    assert claim.lease is not None
    return claim.lease.epoch


async def another_holder(pool: Pool) -> Attempt:
    a = await _start_as_a(pool)
    await _expire(pool, a.task_id)
    b_epoch = await _take(pool, a.task_id, "B")
    return Attempt(Fence(a.task_id, a.run_id, "A", b_epoch))


async def older_epoch(pool: Pool) -> Attempt:
    a = await _start_as_a(pool)
    assert await _take(pool, a.task_id, "A") == a.epoch + 1  # live, so no expiry in play
    return Attempt(a)


async def expired(pool: Pool) -> Attempt:
    a = await _start_as_a(pool)
    await _expire(pool, a.task_id)
    return Attempt(a)


async def resent(pool: Pool) -> Attempt:
    a = await _start_as_a(pool)
    first = Attempt(a)
    assert await _write(pool, first)
    newer = await _take(pool, a.task_id, "A")
    await _expire(pool, a.task_id)
    return Attempt(Fence(a.task_id, a.run_id, "A", newer), first.checkpoint_id)


# Statement, clause, and the situation that clause alone refuses.
CASES: list[tuple[Statement, str, Situation]] = [
    (RENEW, "l.holder_id = %(holder_id)s", another_holder),
    (RENEW, "l.epoch = %(epoch)s", older_epoch),
    (RENEW, "l.expires_at > now()", expired),
    (RELEASE, "l.holder_id = %(holder_id)s", another_holder),
    (RELEASE, "l.epoch = %(epoch)s", older_epoch),
    (FENCE_HOLDS, "l.holder_id = %(holder_id)s", another_holder),
    (FENCE_HOLDS, "l.epoch = %(epoch)s", older_epoch),
    (FENCE_HOLDS, "l.expires_at > now()", expired),
    (LOCK_FENCED, "l.holder_id = %(holder_id)s", another_holder),
    (LOCK_FENCED, "l.epoch = %(epoch)s", older_epoch),
    (LOCK_FENCED, "l.expires_at > now()", expired),
    (WRITE_BATCH, "l.holder_id = i.holder_id", another_holder),
    (WRITE_BATCH, "l.epoch = i.epoch", older_epoch),
    (WRITE_BATCH, "l.expires_at > now()", expired),
    (WRITE_BATCH, "c.lease_epoch = i.epoch", resent),
]

each_case = pytest.mark.parametrize(
    ("statement", "clause", "situation"),
    CASES,
    ids=[f"{s}: {c} ({f.__name__})" for s, c, f in CASES],
)


@pytest.fixture(scope="module")
async def pool(pg_server_url: str, template_db: str) -> AsyncIterator[Pool]:
    """One fresh database for the whole table (as `db_url` makes one per test), which keeps it
    fast: every case works on a task of its own, so the cases cannot see each other."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
        await admin.execute(f"CREATE DATABASE {name} TEMPLATE {template_db}")
    assert database.ROUTE is not None
    url = database.ROUTE.client(name)
    try:
        async with AsyncConnectionPool(url, kwargs={"autocommit": True}, min_size=1) as p:
            yield p
    finally:
        async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def _snapshot(pool: Pool, task_id: str) -> tuple[Any, ...]:
    """The task's lease and checkpoint rows, whole, and how many events it has."""
    async with pool.connection() as conn:
        reads = [
            "SELECT * FROM task_workflow_leases WHERE task_id = %s",
            "SELECT * FROM workflow_checkpoints WHERE task_id = %s",
            "SELECT count(*) FROM workflow_events WHERE task_id = %s",
        ]
        return tuple([await (await conn.execute(q, (task_id,))).fetchone() for q in reads])


@each_case
async def test_the_statement_refuses_what_its_clause_guards(
    pool: Pool, statement: Statement, clause: str, situation: Situation
) -> None:
    attempt = await situation(pool)
    before = await _snapshot(pool, attempt.fence.task_id)
    assert not await statement.attempt(pool, attempt)
    assert await _snapshot(pool, attempt.fence.task_id) == before


@each_case
async def test_without_its_clause_the_case_gets_through(
    pool: Pool,
    statement: Statement,
    clause: str,
    situation: Situation,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The case above fails if only this clause is gone (`true` in its place), so it pins it."""
    assert statement.sql.count(clause) == 1, f"{clause!r} is not (once) in {statement}"
    attempt = await situation(pool)
    monkeypatch.setattr(statement.module, statement.constant, statement.sql.replace(clause, "true"))
    assert await statement.attempt(pool, attempt)


def test_every_fenced_statement_is_in_the_table() -> None:
    """Each storage statement with the fence's holder-and-epoch check has cases above (and each
    statement above still has that check, in the fence's own words)."""
    fenced = re.compile(r"l\.holder_id = \S+ AND l\.epoch = \S+")
    found = set()
    for info in pkgutil.iter_modules(workflow_engine.storage.__path__):
        module = importlib.import_module(f"workflow_engine.storage.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, str) and fenced.search(value) and "{holder}" not in value:
                found.add((module.__name__, name))
    assert found == {(s.module.__name__, s.constant) for s, _, _ in CASES}
