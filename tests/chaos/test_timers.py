"""Case 11: kill -9 around a schedule slot's firing and around an approval's expiry; each
happens exactly once.

Time is an input that survives restarts (issue 52): a schedule's slot starts one workflow
however often the replica firing it dies, and an approval request that expires has one outcome
however often the replica applying the expiry dies. Each test kills engines at random offsets
around the instants the timers act (slots are whole multiples of the interval since the epoch;
an expiry is the request's `expires_at`), restarts them, and reads what the database holds.

Schedules: with a second replica alive whenever one is killed, no slot may be missing; with
one engine, a slot may be missing only where the catch-up policy allows it (RUN_ONCE: of the
slots that came due while no engine ran, only the latest fires).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psycopg
import pytest

from tests.chaos.conftest import record, scale
from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, open_to_jobs, step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

INTERVAL = 2.0
#: The timers' sweep: often enough that an on-time slot fires within a fraction of its interval.
TIMER_ENV = {
    "WORKFLOW_ENGINE_TIMER_INTERVAL_SECONDS": "0.2",
    # Long enough that a slot passed during a restart is still on time when the engine is back.
    "WORKFLOW_ENGINE_SCHEDULE_MISSED_AFTER_SECONDS": "60",
}
#: Short leases: a run killed mid-node is adopted by recovery within seconds.
TTL = 3
#: How far (s) around a timer's instant a kill lands: before it, while it acts, just after.
KILL_BEFORE, KILL_AFTER = 0.3, 0.5
#: Slack (s) for a restarted engine's first sweep after it serves, and for a slot's firing (a
#: sweep's interval and the start itself): a slot older than that at a kill had fired.
FIRST_SWEEP = FIRING = 1.0


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return open_to_jobs(tmp_path_factory.mktemp("timers"))


@dataclass
class Fleet:
    """The engines of one test, by holder id; each restart is a new process with the same id.
    `downtime` holds, for a fleet with nobody left running, each (killed, serving again)."""

    db_url: str
    data_dir: Path
    engines: dict[str, EngineProcess] = field(default_factory=dict)
    downtime: list[tuple[float, float]] = field(default_factory=list)

    def start(self, holder: str) -> EngineProcess:
        engine = EngineProcess(
            db_url=self.db_url,
            data_dir=self.data_dir,
            holder_id=holder,
            ttl=TTL,
            extra_env=TIMER_ENV,
        )
        self.engines[holder] = engine
        return engine

    def kill_and_restart(self, holder: str) -> None:
        """SIGKILL `holder`'s engine, start it again; note the downtime if none was left."""
        alone = sum(e.alive() for e in self.engines.values()) == 1
        killed = time.time()
        self.engines[holder].kill()
        self.start(holder)
        if alone:
            self.downtime.append((killed, time.time()))

    @property
    def address(self) -> str:
        return next(e.address for e in self.engines.values() if e.alive())

    def kill_all(self) -> None:
        for engine in self.engines.values():
            engine.kill()


@pytest.fixture
def fleet(db_url: str, shared_dir: Path) -> Iterator[Fleet]:
    made = Fleet(db_url, shared_dir / "data")
    yield made
    made.kill_all()


async def sleep_until(instant: float) -> None:
    await asyncio.sleep(max(0.0, instant - time.time()))


def next_slot(after: float) -> float:
    return (math.floor(after / INTERVAL) + 1) * INTERVAL


# -- schedules --------------------------------------------------------------------------------


async def create_schedule(address: str) -> str:
    schedule = pb.Schedule(
        cron=f"@every {INTERVAL:g}s",
        task=task(step("tick", "true")),
        overlap=pb.ALLOW,  # a slot whose run a kill left unfinished must not hold the next back
        catch_up=pb.RUN_ONCE,
    )
    async with grpc.aio.insecure_channel(address) as channel:
        created = await pb_grpc.WorkflowEngineStub(channel).CreateSchedule(
            pb.CreateScheduleRequest(schedule=schedule)
        )
    return created.schedule_id


async def fired_slots(db_url: str, schedule_id: str) -> Counter[float]:
    """How many workflows the schedule started for each slot (epoch seconds)."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT extract(epoch FROM schedule_slot)::float8, count(*)"
            " FROM workflow_checkpoints WHERE schedule_id = %s GROUP BY 1",
            (schedule_id,),
        )
        return Counter({slot: n for slot, n in await cur.fetchall()})


async def listed_slots(address: str, schedule_id: str) -> Counter[float]:
    """The same through ListWorkflows' schedule filter, every page."""
    slots: Counter[float] = Counter()
    token = ""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        while True:
            page = await stub.ListWorkflows(
                pb.ListWorkflowsRequest(schedule_id=schedule_id, page_size=500, page_token=token)
            )
            for wf in page.workflows:
                assert wf.schedule_id == schedule_id
                slots[float(wf.schedule_slot.seconds)] += 1
            token = page.next_page_token
            if not token:
                return slots


def allowed_missing(slot: float, downtime: list[tuple[float, float]]) -> bool:
    """RUN_ONCE: a slot may start nothing when no engine was left to fire it (it came due in
    a downtime, or the kill caught its firing) and the next slot came due too before an engine
    swept again: then only the latest of them fires."""
    return any(
        killed - FIRING <= slot and slot + INTERVAL <= up + FIRST_SWEEP for killed, up in downtime
    )


async def kill_around_slots(fleet: Fleet, holders: list[str], kills: int) -> list[float]:
    """Kill `holders` in turn, each at a random offset around a coming slot; the offsets."""
    rng = random.Random()
    offsets = []
    for n in range(kills):
        offset = rng.uniform(-KILL_BEFORE, KILL_AFTER)
        await sleep_until(next_slot(time.time() + KILL_BEFORE + 0.1) + offset)
        fleet.kill_and_restart(holders[n % len(holders)])
        offsets.append(round(offset, 2))
        await asyncio.sleep(rng.uniform(0, INTERVAL))  # let a slot or two fire undisturbed
    return offsets


async def check_slots(fleet: Fleet, schedule_id: str, case: str, offsets: list[float]) -> None:
    await asyncio.sleep(2 * INTERVAL)  # the engines back fire a few slots more
    listed = await listed_slots(fleet.address, schedule_id)
    fleet.kill_all()
    slots = await fired_slots(fleet.db_url, schedule_id)
    assert slots, "the schedule fired nothing"
    first, last = min(slots), max(slots)
    expected = [first + INTERVAL * i for i in range(round((last - first) / INTERVAL) + 1)]
    missing = [s for s in expected if s not in slots]
    doubled = {s: n for s, n in slots.items() if n > 1}
    record(
        case,
        slots_fired=len(slots),
        kills=len(offsets),
        slots_missing_allowed_by_catch_up=len(missing),
        slots_started_twice=len(doubled),
    )
    detail = f"kill offsets {offsets}, downtime {fleet.downtime}"
    assert not doubled, f"slots started more than once: {doubled}; {detail}"
    assert all(s in expected for s in slots), f"slots off the calendar: {sorted(slots)}"
    not_allowed = [s for s in missing if not allowed_missing(s, fleet.downtime)]
    assert not not_allowed, f"slots missing: {not_allowed}; {detail}"
    assert set(listed) <= set(slots) and max(listed.values()) == 1


async def test_each_slot_fires_once_while_either_of_two_replicas_is_killed(fleet: Fleet) -> None:
    """A replica is always alive: every slot from the first to the last fires, once."""
    fleet.start("a")
    fleet.start("b")
    schedule_id = await create_schedule(fleet.address)
    offsets = await kill_around_slots(fleet, ["a", "b"], scale(3, 12))
    assert not fleet.downtime
    await check_slots(fleet, schedule_id, "11 timers: slots, 2 replicas", offsets)


async def test_each_slot_fires_once_across_restarts_of_the_only_engine(fleet: Fleet) -> None:
    """Killed alone: no slot twice; missing only the slots RUN_ONCE leaves out of a downtime."""
    fleet.start("only")
    schedule_id = await create_schedule(fleet.address)
    offsets = await kill_around_slots(fleet, ["only"], scale(2, 10))
    await check_slots(fleet, schedule_id, "11 timers: slots, 1 engine", offsets)


# -- approval expiry --------------------------------------------------------------------------

ON_TIMEOUT = {"REJECT": pb.ApprovalTimeout.REJECT, "SUSPEND": pb.ApprovalTimeout.SUSPEND}
EXPIRY_SECONDS = 2


async def start_waiting(address: str, actions: list[str]) -> dict[str, tuple[str, float]]:
    """Start one workflow per action whose only step waits for approval, a little apart so
    their expiries spread; task id -> (action, when its request expires)."""
    started: dict[str, tuple[str, float]] = {}
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        for action in actions:
            gate = step(
                "gate",
                "true",
                requires_approval=True,
                approval_timeout_seconds=EXPIRY_SECONDS,
                on_approval_timeout=ON_TIMEOUT[action],
            )
            task_id = new_task_id()
            await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=task(gate)))
            started[task_id] = (action, 0.0)
            await asyncio.sleep(0.15)
        for task_id, (action, _) in started.items():
            wf = await wait_for_status(stub, task_id, {pb.WAITING_FOR_APPROVAL}, timeout=30)
            expires = wf.pending_approval.expires_at
            assert expires.seconds, "a request with a timeout has an expiry"
            started[task_id] = (action, expires.seconds + expires.nanos / 1e9)
    return started


async def outcomes(db_url: str, task_id: str) -> tuple[str, list[tuple[str, str, str, str]]]:
    """The workflow's status and its history as (kind, actor, status, detail), oldest first."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT status FROM workflow_checkpoints WHERE task_id = %s", (task_id,)
        )
        row = await cur.fetchone()
        assert row is not None
        cur = await conn.execute(
            "SELECT kind, actor, status, detail FROM workflow_events WHERE task_id = %s"
            " ORDER BY seq",
            (task_id,),
        )
        events = [(str(k), str(a), str(s), str(d)) for k, a, s, d in await cur.fetchall()]
        return str(row[0]), events


def one_outcome(action: str, status: str, history: list[tuple[str, str, str, str]]) -> None:
    """One decision, the deadline's, applying `action`; then REJECT: the workflow failed and
    was never suspended; SUSPEND: it was suspended once, and still is."""
    decided = [(actor, detail) for kind, actor, _, detail in history if kind == "approval_decided"]
    statuses = [after for _, _, after, _ in history]
    suspensions = sum(
        1
        for before, after in zip(["", *statuses], statuses, strict=False)
        if after == "SUSPENDED" and before != "SUSPENDED"
    )
    assert [actor for actor, _ in decided] == ["deadline"], history
    assert decided[0][1].startswith(f"{action.lower()} step gate"), history
    if action == "REJECT":
        assert (status, suspensions) == ("FAILED", 0), history
    else:
        assert (status, suspensions) == ("SUSPENDED", 1), history


async def decided_before(db_url: str, task_ids: list[str], instant: float) -> int:
    """How many of `task_ids` had their expiry applied before `instant` (by the killed one)."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM workflow_events WHERE kind = 'approval_decided'"
            " AND task_id = ANY(%s::uuid[]) AND created_at < to_timestamp(%s)",
            (task_ids, instant),
        )
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def kill_around_expiry(
    fleet: Fleet, started: dict[str, tuple[str, float]], restart: str, offset: float
) -> float:
    """SIGKILL the engine `offset` s from the middle expiry of `started`, and start it again
    (or another replica in its place); the instant of the kill."""
    expiries = sorted(expires for _, expires in started.values())
    await sleep_until(expiries[len(expiries) // 2] + offset)
    victim = next(h for h, e in fleet.engines.items() if e.alive())
    killed = time.time()
    if restart == "other-replica":
        fleet.engines[victim].kill()
        fleet.start(f"replica-{len(fleet.engines)}")
    else:
        fleet.kill_and_restart(victim)
    return killed


@pytest.mark.parametrize("restart", ["same-engine", "other-replica"])
async def test_an_expiring_approval_has_one_outcome_when_the_engine_dies_around_it(
    fleet: Fleet, restart: str
) -> None:
    """Each round's workflows wait for approval with a 2 s timeout, REJECT and SUSPEND in
    turn; the engine dies around their expiry. Each ends with one decision, the deadline's,
    and nothing waits on past its expiry (each settles within a lease's time and a margin)."""
    rng = random.Random()
    offsets: list[float] = []
    by_killed = checked = 0
    fleet.start("first")
    for _ in range(scale(1, 4)):
        actions = [("REJECT", "SUSPEND")[i % 2] for i in range(scale(4, 10))]
        started = await start_waiting(fleet.address, actions)
        offsets.append(round(rng.uniform(-KILL_BEFORE, KILL_AFTER), 2))
        killed = await kill_around_expiry(fleet, started, restart, offsets[-1])
        async with grpc.aio.insecure_channel(fleet.address) as channel:
            stub = pb_grpc.WorkflowEngineStub(channel)
            settled: set[int] = {pb.FAILED, pb.SUSPENDED, pb.SUCCEEDED, pb.CANCELLED}
            for task_id in started:
                await wait_for_status(stub, task_id, settled, timeout=TTL + 30)
        by_killed += await decided_before(fleet.db_url, list(started), killed)
        for task_id, (action, _) in started.items():
            status, history = await outcomes(fleet.db_url, task_id)
            one_outcome(action, status, history)
            checked += 1
    record(
        f"11 timers: expiry, {restart}",
        workflows=checked,
        kill_offsets_from_middle_expiry=offsets,
        expiries_applied_before_the_kill=by_killed,
        workflows_with_exactly_one_outcome=checked,
    )
