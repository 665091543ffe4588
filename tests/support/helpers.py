"""Small builders and waiters shared by the tests."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc
import psycopg
from google.protobuf import json_format, struct_pb2

from workflow_engine.config import JobSettings
from workflow_engine.domain import TaskSpec
from workflow_engine.sandbox import SAFE_PATH, Confinement
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

#: A Python that local jobs can run: under root, a job runs as its own user, which cannot enter
#: /root, where the test environment's interpreter may live.
JOB_PYTHON = shutil.which("python3", path=SAFE_PATH) or "python3"

TERMINAL = {pb.SUCCEEDED, pb.FAILED, pb.CANCELLED}
#: The host directories the tests' jobs may write in (pytest's: `tests.conftest` sets it).
WRITABLE_PATHS = "WORKFLOW_ENGINE_JOB_WRITABLE_PATHS"


def open_to_jobs(path: Path) -> Path:
    """Let local jobs write in `path`, a directory of pytest's (made if missing).

    Run as root, the local sandbox runs each job as a user of its own (docs/security.md),
    which may not enter pytest's 0700 directories. Tests whose jobs leave marks (a line per
    run, the remediation they saw) leave them in such a directory, as a deployment grants its
    jobs a shared one; the ancestors become enter-only, and what the engine keeps to itself
    (job directories, the files a test makes 0600) stays closed.
    """
    path.mkdir(parents=True, exist_ok=True)
    for ancestor in _pytests_own(path):
        ancestor.chmod(ancestor.stat().st_mode & 0o777 | 0o111)  # enter, not list
    path.chmod(0o777)
    return path


def granted_confinement(**options: Any) -> Confinement:
    """The local sandbox's confinement as the tests' engines have it: jobs may write in pytest's
    directories (``WORKFLOW_ENGINE_JOB_WRITABLE_PATHS``, which `tests.conftest` sets), the rest
    of the host read-only for them."""
    writable = JobSettings(writable_paths=os.environ.get(WRITABLE_PATHS, "")).writable()
    return Confinement(writable_paths=writable, **options)


def _pytests_own(path: Path) -> list[Path]:
    """The ancestors of `path` that pytest made, up to its ``pytest-of-<user>`` (one level
    more under pytest-xdist: ``pytest-N/popen-gwK/``)."""
    owned = []
    for ancestor in path.parents:
        owned.append(ancestor)
        if ancestor.name.startswith("pytest-of-"):
            return owned
    raise ValueError(f"{path} is not in pytest's temporary directories")


def job_pids(token: str) -> list[int]:
    """The host's pids of the live processes whose command line holds `token`.

    A local job runs in a PID namespace of its own, so the pids it can tell (``$$``, ``$!``)
    are its namespace's, not the host's: a test finds a job's processes by what they run (a
    path in the script, or a `unique_sleep`).
    """
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as cmdline:
                argv = cmdline.read()
        except OSError:  # gone meanwhile
            continue
        # Not the job's wrapper, whose command line holds the whole command.
        if token.encode() in argv and not argv.split(b"\0")[0].endswith(b"jobwrap"):
            found.append(int(entry.name))
    return found


def unique_sleep(seconds: int) -> str:
    """A `sleep` argument of about `seconds` that no other process runs (see `job_pids`)."""
    return f"{seconds}.{next(_sleeps)}{time.time_ns() % 10**9:09d}"


_sleeps = itertools.count(1)


def write_secret(path: Path, text: str) -> Path:
    """Write `text` at `path`, readable by its owner alone (mode 600), as a deployment keeps a
    token or a key: run as root, the engine refuses one that others may read
    (docs/security.md)."""
    path.write_text(text)
    path.chmod(0o600)
    return path


def new_task_id() -> str:
    return str(uuid.uuid4())


def check(kind: str, value: str = "", field: str = "", equals: Any = None) -> pb.Check:
    msg = pb.Check(kind=kind, value=value, field=field)
    if equals is not None:
        json_format.ParseDict(equals, msg.equals)
    return msg


def step(step_id: str, *command: str, expect: Iterable[pb.Check] = (), **kw: Any) -> pb.Step:
    return pb.Step(id=step_id, command=list(command), expect=list(expect), **kw)


def shell_step(step_id: str, script: str, **kw: Any) -> pb.Step:
    """A step running `script` with /bin/sh (the step is argv; the shell is our choice here)."""
    return step(step_id, "/bin/sh", "-c", script, **kw)


def task(*steps: pb.Step, **kw: Any) -> pb.TaskSpec:
    return pb.TaskSpec(prompt=kw.pop("prompt", "test task"), steps=list(steps), **kw)


def struct(data: dict[str, Any]) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    json_format.ParseDict(data, s)
    return s


async def wait_for_status(
    stub: pb_grpc.WorkflowEngineStub,
    task_id: str,
    statuses: set[int] = TERMINAL,
    timeout: float = 60,
    metadata: Sequence[tuple[str, str]] = (),
) -> pb.Workflow:
    """Poll GetWorkflow (with `metadata`: a token) until the status is one of `statuses`."""
    deadline = time.monotonic() + timeout
    while True:
        wf = await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id), metadata=metadata)
        if wf.status in statuses:
            return wf
        if time.monotonic() > deadline:
            raise TimeoutError(f"workflow {task_id} still {pb.WorkflowStatus.Name(wf.status)}")
        await asyncio.sleep(0.05)


async def wait_until_released(
    stub: pb_grpc.WorkflowEngineStub, task_id: str, timeout: float = 60
) -> pb.Workflow:
    """Poll GetWorkflow until no one holds the lease: a run releases it after its last write."""
    deadline = time.monotonic() + timeout
    while True:
        wf = await stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
        if not wf.lease_holder_id:
            return wf
        if time.monotonic() > deadline:
            raise TimeoutError(f"workflow {task_id} still leased by {wf.lease_holder_id!r}")
        await asyncio.sleep(0.05)


async def watch_until_end(
    stub: pb_grpc.WorkflowEngineStub,
    task_id: str,
    from_sequence: int = 0,
    timeout: float = 60,
    kinds: Sequence[pb.EventKind.ValueType] = (),
) -> list[pb.WorkflowEvent]:
    """Every event of a watch stream, which ends by itself after a terminal status."""

    async def collect() -> list[pb.WorkflowEvent]:
        call = stub.WatchWorkflow(
            pb.WatchWorkflowRequest(task_id=task_id, from_sequence=from_sequence, kinds=kinds)
        )
        return [event async for event in call]

    return await asyncio.wait_for(collect(), timeout)


async def snapshot(db_url: str) -> dict[str, list[Any]]:
    """Every row of the engine's tables, as text, in a stable order."""
    tables = ["workflow_checkpoints", "task_workflow_leases", "workflow_tasks", "workflow_events"]
    out: dict[str, list[Any]] = {}
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        for table in tables:
            cur = await conn.execute(f"SELECT t::text FROM {table} t ORDER BY 1")
            out[table] = await cur.fetchall()
    return out


async def stored_task(db_url: str, task_id: str) -> TaskSpec:
    """The task stored with the task's workflow (`workflow_tasks`)."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute("SELECT spec FROM workflow_tasks WHERE task_id = %s", (task_id,))
        row = await cur.fetchone()
    assert row is not None, "no task stored with the workflow"
    return TaskSpec.from_json(row[0])


async def refusal(call: Any) -> tuple[grpc.StatusCode, str]:
    """The status and message a gRPC call was refused with; fails when it was answered."""
    try:
        result = await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), (exc.details() or "")
    raise AssertionError(f"not refused: {result}")


async def stored_schedules(db_url: str) -> int:
    """How many schedules the database holds."""
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute("SELECT count(*) FROM workflow_schedules")
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])
