"""Capture the rows an older engine really wrote, for `tests/integration/upgrade` (issue 51).

    python tools/capture_rows.py 30ae8d1 8fddea0    # writes tests/fixtures/older_rows/<commit>/

For each commit named, this checks the commit out in a detached worktree of its own (building
its ``jobwrap`` when the commit has one), serves that commit's engine (`python -m
workflow_engine serve`, its own code on ``PYTHONPATH``, this interpreter's packages) against a
fresh PostgreSQL (the embedded `pgserver`, in a temporary directory) that the old engine
migrates itself, and drives it through its own gRPC stubs into each case of `CASES`:

- ``approval``: the second of three steps waits for approval; the engine is then stopped the
  way a rolling deploy stops it (SIGTERM);
- ``mid_job``: the engine is killed (SIGKILL) while the second step's job (a `sleep`) runs;
- ``mid_retry``: the second step failed its check at attempt 1 (it passes from attempt 2 on,
  by ``WORKFLOW_ENGINE_ATTEMPT``); the engine is killed while attempt 2 runs;
- ``parallel``: two steps after the first run at once (``depends_on``); the engine is killed
  once the short one has ended, while the long one runs.

Nothing is written by hand: each case's file holds, as the old engine left them, every row of
every table with a ``task_id`` column (``to_jsonb``: all the columns that schema had), the
schema version (rows of ``workflow_engine_migrations``), and the task's job directories as
they were once their jobs had ended (a job outlives the engine that started it), so a test can
give today's engine the old jobs directory as well. Each step prints its id and a fresh UUID,
so a result that was kept can be told from one that was made again.

Slow (a minute or two per commit) and not part of ``make test``. Run as root (the engines run
their jobs as users of their own), from the repository root, with the project's virtualenv.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "older_rows"
JOBWRAP = "workflow_engine/sandbox/jobwrap"
GIT = shutil.which("git") or "git"
CC = shutil.which("cc") or "cc"
#: The job files worth keeping (see `workflow_engine.sandbox._files`); ``work/`` is left out.
JOB_FILES = (
    "request.json",
    "supervisor.pid",
    "supervisor.log",
    "stdout.log",
    "stderr.log",
    "exit_status",
    "timed_out",
    "cancel",
    "result.json",
)

Job = dict[str, Any]  # step_id, attempt, started, ended: what a job directory says now


@dataclass(frozen=True)
class Case:
    """A task, when to stop the engine under it (`ready`), and how (`stop`)."""

    description: str
    steps: list[dict[str, Any]]
    ready: Callable[[str, list[Job]], bool]
    stop: signal.Signals


def _marked(step_id: str, before: str = "", after: str = "") -> list[str]:
    """A step's command: `before`, then its id and a fresh UUID on stdout, then `after`."""
    script = f"{before}echo {step_id} $(cat /proc/sys/kernel/random/uuid){after}"
    return ["/bin/sh", "-c", script]


def _job(jobs: list[Job], step_id: str, attempt: int = 1) -> Job:
    found = [j for j in jobs if j["step_id"] == step_id and j["attempt"] == attempt]
    return found[0] if found else {"started": False, "ended": False}


CASES: dict[str, Case] = {
    "approval": Case(
        "three steps; 'b' requires approval: WAITING_FOR_APPROVAL, engine stopped (SIGTERM)",
        [
            {"id": "a", "command": _marked("a")},
            {"id": "b", "command": _marked("b"), "requires_approval": True},
            {"id": "c", "command": _marked("c")},
        ],
        lambda status, jobs: status == "WAITING_FOR_APPROVAL",
        signal.SIGTERM,
    ),
    "mid_job": Case(
        "three steps; engine killed (SIGKILL) while the job of 'b' (sleep 5) runs",
        [
            {"id": "a", "command": _marked("a")},
            {"id": "b", "command": _marked("b", before="sleep 5; ")},
            {"id": "c", "command": _marked("c")},
        ],
        lambda status, jobs: bool(_job(jobs, "b")["started"]),
        signal.SIGKILL,
    ),
    "mid_retry": Case(
        "three steps; 'b' fails at attempt 1, passes from 2; engine killed during attempt 2",
        [
            {"id": "a", "command": _marked("a")},
            {
                "id": "b",
                "command": _marked(
                    "b", before="sleep 2; ", after='; test "$WORKFLOW_ENGINE_ATTEMPT" -ge 2'
                ),
            },
            {"id": "c", "command": _marked("c")},
        ],
        lambda status, jobs: bool(_job(jobs, "b", 2)["started"]),
        signal.SIGKILL,
    ),
    "parallel": Case(
        "a, then b and c at once, then d; engine killed after b ended, while c (sleep 8) runs",
        [
            {"id": "a", "command": _marked("a")},
            {"id": "b", "command": _marked("b", before="sleep 1; "), "depends_on": ["a"]},
            {"id": "c", "command": _marked("c", before="sleep 8; "), "depends_on": ["a"]},
            {"id": "d", "command": _marked("d"), "depends_on": ["b", "c"]},
        ],
        lambda status, jobs: bool(_job(jobs, "b")["ended"] and _job(jobs, "c")["started"]),
        signal.SIGKILL,
    ),
}


def _jobs(jobs_dir: Path) -> list[Job]:
    """What the job directories say now (a directory whose request is not written yet is
    skipped)."""
    found: list[Job] = []
    for job_dir in sorted(jobs_dir.glob("*")) if jobs_dir.is_dir() else []:
        try:
            request = json.loads((job_dir / "request.json").read_text())
        except (OSError, ValueError):
            continue
        found.append(
            {
                "dir": job_dir.name,
                "step_id": request.get("step_id", ""),
                "attempt": int(request.get("attempt") or 1),
                "started": (job_dir / "stdout.log").exists(),
                # The result, or (jobwrap's, whose engine writes the result) the exit status.
                "ended": any((job_dir / f).exists() for f in ("result.json", "exit_status")),
            }
        )
    return found


def _job_files(jobs_dir: Path, names: list[str]) -> dict[str, dict[str, str]]:
    """The kept files of each job directory in `names`, as text."""
    out: dict[str, dict[str, str]] = {}
    for name in names:
        files = {}
        for file in JOB_FILES:
            path = jobs_dir / name / file
            if path.is_file():
                files[file] = path.read_text(errors="replace")
        out[name] = files
    return out


def _rows(url: str, task_id: str) -> tuple[int, dict[str, list[dict[str, Any]]]]:
    """The schema version, and the task's rows in every table with a ``task_id`` column."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(url) as conn:
        version = conn.execute("SELECT count(*) FROM workflow_engine_migrations").fetchone()
        tables = conn.execute(
            "SELECT table_name FROM information_schema.columns WHERE table_schema = 'public'"
            " AND column_name = 'task_id' ORDER BY table_name"
        ).fetchall()
        rows: dict[str, list[dict[str, Any]]] = {}
        for (table,) in tables:
            query = sql.SQL(
                "SELECT to_jsonb(t) FROM {} t WHERE task_id = %s"
                " ORDER BY to_jsonb(t) -> 'seq' NULLS FIRST, to_jsonb(t)::text"
            ).format(sql.Identifier(table))
            cur = conn.execute(query, (task_id,))
            rows[table] = [row[0] for row in cur.fetchall()]
    assert version is not None
    return int(version[0]), rows


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve(worktree: Path, url: str, data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    """The old commit's engine, serving on `port` (its own migrations run at start)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(worktree),
        "WORKFLOW_ENGINE_DATABASE_URL": url,
        "WORKFLOW_ENGINE_LISTEN": f"127.0.0.1:{port}",
        "WORKFLOW_ENGINE_DATA_DIR": str(data_dir),
        "WORKFLOW_ENGINE_HOLDER_ID": f"old-engine-{worktree.name}",
        "WORKFLOW_ENGINE_PROCESSES": "1",  # one process to kill (unknown to the earliest)
        "WORKFLOW_ENGINE_LOG_LEVEL": "warning",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "workflow_engine", "serve"], cwd=worktree, env=env
    )


def _wait(what: str, done: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout}s for {what}")
        time.sleep(0.05)


def _drive(case: Case, port: int, jobs_dir: Path) -> str:
    """Start the case's task; return its id once the case is `ready` to stop."""
    import grpc
    from google.protobuf import json_format

    from workflow_engine.v1 import workflow_engine_pb2 as pb
    from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

    task_id = str(uuid.uuid4())
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        grpc.channel_ready_future(channel).result(timeout=120)
        stub = pb_grpc.WorkflowEngineStub(channel)
        spec = json_format.ParseDict({"prompt": "older rows", "steps": case.steps}, pb.TaskSpec())
        stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))

        def ready() -> bool:
            wf = stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
            status = pb.WorkflowStatus.Name(wf.status)
            if status in ("SUCCEEDED", "FAILED", "CANCELLED"):
                raise RuntimeError(f"the workflow ended {status} before the case was ready")
            return case.ready(status, _jobs(jobs_dir))

        _wait("the case", ready)
    return task_id


def _capture_case(commit: str, name: str, worktree: Path, admin_url: str, tmp: Path) -> None:
    import psycopg
    from psycopg.conninfo import make_conninfo

    case = CASES[name]
    dbname = f"older_{name}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {dbname}")
    url = make_conninfo(admin_url, dbname=dbname)
    data_dir = tmp / name
    jobs_dir = data_dir / "jobs"
    port = _free_port()
    engine = _serve(worktree, url, data_dir, port)
    try:
        task_id = _drive(case, port, jobs_dir)
        time.sleep(1.0)  # let the engine write what it does at that moment (a result, a lease)
        engine.send_signal(case.stop)
        engine.wait(timeout=60)
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
    at_stop = _jobs(jobs_dir)
    # A job may outlive the engine that started it: give the ones in flight time to end.
    try:
        _wait("the jobs in flight", lambda: all(j["ended"] for j in _jobs(jobs_dir)), 20)
    except TimeoutError:
        print(f"{name}: some jobs did not end after the engine stopped", flush=True)
    schema, rows = _rows(url, task_id)
    fixture = {
        "commit": commit,
        "case": name,
        "description": case.description,
        "stopped_with": case.stop.name,
        "task_id": task_id,
        "schema_version": schema,
        "rows": rows,
        "jobs_at_stop": at_stop,
        "job_files": _job_files(jobs_dir, [j["dir"] for j in at_stop]),
    }
    out = OUT / commit / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(fixture, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out.relative_to(ROOT)}", flush=True)


def capture(commit: str, worktree: Path, cases: list[str]) -> None:
    """Every case of `cases` with the engine checked out at `worktree`, on a fresh server."""
    from pgserver.postgres_server import get_server

    with tempfile.TemporaryDirectory(prefix="older-rows-", dir="/var/tmp") as tmp_name:
        tmp = Path(tmp_name)
        tmp.chmod(0o755)  # the jobs' own users enter the jobs directories below
        server = get_server(tmp / "pgdata", cleanup_mode="stop")
        try:
            for name in cases:
                _capture_case(commit, name, worktree, str(server.get_uri()), tmp)
        finally:
            server.cleanup()


def _checkout(commit: str, into: Path) -> Path:
    """A detached worktree of `commit` under `into`, with its jobwrap built if it has one."""
    worktree = into / commit
    subprocess.run(
        [GIT, "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), commit],
        check=True,
    )
    source = worktree / f"{JOBWRAP}.c"
    if source.exists():  # as its Makefile builds it: static if this host can, else not
        built = [CC, "-O2", "-o", str(worktree / JOBWRAP), str(source)]
        if subprocess.run([*built, "-static"], check=False).returncode != 0:
            subprocess.run(built, check=True)
    return worktree


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("commits", nargs="+", help="commits whose engines write the rows")
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="default: all")
    parser.add_argument("--worktree", type=Path, help=argparse.SUPPRESS)  # the re-run's
    args = parser.parse_args(argv)
    cases = args.case or list(CASES)
    if args.worktree is not None:  # run with the old commit's code on PYTHONPATH
        capture(args.commits[0], args.worktree, cases)
        return 0
    with tempfile.TemporaryDirectory(prefix="older-engines-", dir="/var/tmp") as tmp:
        for commit in args.commits:
            worktree = _checkout(commit, Path(tmp))
            try:
                subprocess.run(
                    [sys.executable, __file__, commit, "--worktree", str(worktree)]
                    + [f"--case={name}" for name in cases],
                    env={**os.environ, "PYTHONPATH": str(worktree)},
                    check=True,
                )
            finally:
                subprocess.run(
                    [GIT, "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                    check=False,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
