"""Workflows older engines left mid-way run to the end on today's engine, each job once.

The rows are `tests/fixtures/older_rows/<commit>/<case>.json`, made by really running the
engine of 30ae8d1 (issue 5's), of 8fddea0 (main before issue 51; both state format 1) and of
58b0b81 (0.14.0, state format 2) and stopping it in each case (`tools/capture_rows.py`):
waiting for approval (stopped with SIGTERM), killed with SIGKILL mid-job, killed during a
retry's second attempt, and killed while one of two parallel steps still ran.
`tests.support.older_rows` loads them at the schema they were written with and upgrades it;
today's engine then recovers the killed ones (their lease expired long ago) and is sent the
approval the paused one waits for.

How runs are counted. A job runs as a user of its own, in a mount namespace with a private
/tmp, so what it leaves is not where a test could count it; the engine's side is: a local job
runs only in ``jobs_dir/<job_id>/``, made when it is claimed (once per id; a second dispatch
of the id re-attaches, never runs again), with the request (step, attempt) and the command's
``stdout.log``. A job directory with a ``stdout.log`` is one run of the command, and its job
id is per task, step and attempt, so a step run again shows as a second directory of a later
attempt. Each step also prints a fresh UUID, so a result kept from the old engine can be told
from one made again.

What today's engine does with a job it has no record of (its id is in the checkpoint, its
directory is not in this engine's jobs directory): it runs it (`sandbox._runner`: making the
directory claims the job). The old engines' jobs outlive a SIGKILL of the engine (both wrote
the command's exit status or result after the kill; see the fixtures' ``job_files``). So each
case runs twice:

- ``shared-jobs``: the new replica has the old one's job directories (the jobs volume replicas
  share in a deployment). Every job ran once in total: the job in flight at the kill is
  re-attached and its result collected, nothing is run again;
- ``own-jobs``: the new replica has an empty jobs directory (a replica on another host, or a
  volume lost). What the old engine had collected is not run again; the job in flight at the
  kill, whose result this engine cannot see, runs once more, once, here.

In both, the workflow ends SUCCEEDED and its events continue the old ones without a gap.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from google.protobuf import json_format

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.support import database, older_rows
from tests.support.helpers import wait_for_status
from tests.support.older_rows import OlderRows
from workflow_engine.config import Settings
from workflow_engine.domain.state_format import STATE_FORMAT
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.version import __version__

CASES = older_rows.all_cases()
Job = tuple[str, int]  # step id, attempt


@asynccontextmanager
async def upgraded(
    pg_server_url: str, settings: Settings, older: OlderRows, *, share_jobs: bool
) -> AsyncIterator[tuple[RunningEngine, str]]:
    """Today's engine on `older`'s rows (upgraded), with the old job directories if shared."""
    name = await older_rows.restore(pg_server_url, older)
    if share_jobs:
        older_rows.copy_jobs(older, settings.jobs_dir)
    assert database.ROUTE is not None
    url = database.ROUTE.client(name)
    replica = await start_engine(replace(settings, database_url=url))
    try:
        yield replica, url
    finally:
        await stop_engine(replica)
        async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def runs(jobs_dir: Path) -> dict[Job, list[str]]:
    """Each job's runs in `jobs_dir` (see the module docstring), with their stdout."""
    found: dict[Job, list[str]] = {}
    for job_dir in sorted(jobs_dir.iterdir()) if jobs_dir.is_dir() else []:
        stdout = job_dir / "stdout.log"
        if not stdout.exists():
            continue  # claimed, never run (cancelled or refused)
        request = json.loads((job_dir / "request.json").read_text())
        key = (str(request["step_id"]), int(request.get("attempt") or 1))
        found.setdefault(key, []).append(stdout.read_text())
    return found


def old_runs(older: OlderRows) -> dict[Job, str]:
    """The jobs the old engine ran, with their stdout."""
    found: dict[Job, str] = {}
    for files in older.job_files.values():
        if "stdout.log" in files:
            request = json.loads(files["request.json"])
            found[(request["step_id"], int(request.get("attempt") or 1))] = files["stdout.log"]
    return found


def expected_jobs(older: OlderRows, steps: list[str]) -> set[Job]:
    """The jobs the old engine had started, and the first attempt of each step it had not
    reached: no step runs again, and none but the one retried before the stop goes past
    attempt 1 (a step run again at a later attempt is a job too many)."""
    started = {(str(job["step_id"]), int(job["attempt"])) for job in older.jobs_at_stop}
    reached = {step for step, _ in started}
    return started | {(step, 1) for step in steps if step not in reached}


def collected_before(older: OlderRows) -> set[Job]:
    """The jobs whose results the old engine had collected: its ``collect_result`` events
    ("collected a, b"), in order, one per attempt of each step."""
    attempts: Counter[str] = Counter()
    for event in older.events:
        detail = str(event.get("detail") or "")
        if event["node_id"] == "collect_result" and detail.startswith("collected "):
            attempts.update(detail.removeprefix("collected ").split(", "))
    return {(step, n) for step, count in attempts.items() for n in range(1, count + 1)}


async def finish(replica: RunningEngine, older: OlderRows) -> pb.Workflow:
    """Approve what waits for approval, then wait for the end."""
    task_id = older.task_id
    if older.checkpoint["status"] == "WAITING_FOR_APPROVAL":
        waiting = await replica.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
        assert waiting.status == pb.WAITING_FOR_APPROVAL
        pending = older.checkpoint["state"]["pending_approval"]
        assert waiting.pending_approval.step_id == pending["step_id"]
        decision = pb.ApprovalDecision(step_id=waiting.pending_approval.step_id, verdict=pb.APPROVE)
        answer = await replica.stub.ResumeWorkflow(
            pb.ResumeWorkflowRequest(task_id=task_id, decision=decision)
        )
        assert answer.resumed
    return await wait_for_status(replica.stub, task_id, timeout=90)


EVENT_FIELDS = ("seq", "kind", "node_id", "status", "detail")


async def history(url: str, task_id: str) -> tuple[list[dict[str, Any]], int]:
    """The workflow's events, and the last sequence number its checkpoint row gave out."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT seq, kind, node_id, status, detail FROM workflow_events WHERE task_id = %s"
            " ORDER BY seq",
            (task_id,),
        )
        rows = [dict(zip(EVENT_FIELDS, row, strict=True)) for row in await cur.fetchall()]
        cur = await conn.execute(
            "SELECT event_seq FROM workflow_checkpoints WHERE task_id = %s", (task_id,)
        )
        last = await cur.fetchone()
    assert last is not None
    return rows, int(last[0])


def assert_events_continue(older: OlderRows, now: list[dict[str, Any]], last: int) -> None:
    """The old events are kept as they were, and the new ones follow them without a gap."""
    assert [e["seq"] for e in now] == list(range(1, last + 1))
    kept = [{k: e.get(k) or "" for k in EVENT_FIELDS} for e in older.events]
    assert [{k: e[k] or "" for k in EVENT_FIELDS} for e in now[: len(kept)]] == kept
    assert len(now) > len(kept)


async def written_by(url: str, task_id: str) -> tuple[int, str]:
    """The row's state format and the engine that wrote it."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute(
            "SELECT state_format, engine_version FROM workflow_checkpoints WHERE task_id = %s",
            (task_id,),
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


@pytest.mark.parametrize("share_jobs", [True, False], ids=["shared-jobs", "own-jobs"])
@pytest.mark.parametrize("older", CASES, ids=[case.name for case in CASES])
async def test_an_older_engines_workflow_runs_to_the_end_with_every_job_once(
    pg_server_url: str, settings: Settings, older: OlderRows, share_jobs: bool
) -> None:
    async with upgraded(pg_server_url, settings, older, share_jobs=share_jobs) as (replica, url):
        # As written: format 1 before rows recorded one (no such column), else the row's own.
        written = older.rows["workflow_checkpoints"][0].get("state_format", 1)
        assert (await written_by(url, older.task_id))[0] == written
        done = await finish(replica, older)
        assert await written_by(url, older.task_id) == (STATE_FORMAT, __version__)
        assert done.status == pb.SUCCEEDED, done.error
        now_events, last = await history(url, older.task_id)
    state = json_format.MessageToDict(done.state)
    results = {str(r["step_id"]): r for r in state["results"]}
    steps = [str(step["id"]) for step in older.rows["workflow_tasks"][0]["spec"]["steps"]]
    assert sorted(results) == sorted(steps)
    jobs = expected_jobs(older, steps)
    assert {(step, int(r["attempt"])) for step, r in results.items()} == {
        max(job for job in jobs if job[0] == step) for step in steps
    }
    here = runs(settings.jobs_dir)
    assert all(len(outputs) == 1 for outputs in here.values()), here  # one run per job here
    old = old_runs(older)
    if share_jobs:  # once in total: the old runs are here, none made again
        assert set(here) == jobs
        assert {job: here[job][0] for job in old} == old
    else:  # what the old engine had collected is not run again; the rest runs here once
        assert set(here) == jobs - collected_before(older)
    for step, result in results.items():
        job = (step, int(result["attempt"]))
        ran = here[job][0] if job in here else old[job]
        assert result["stdout"] == ran, f"{step}: the result is not its one run's"
    assert_events_continue(older, now_events, last)
