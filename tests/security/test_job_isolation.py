"""One tenant's job cannot reach another's, nor outlive its own end, nor the host's sockets.

Attackers: a tenant who chooses task ids and writes steps (or a model writing them). Against a
served engine running as root with scoped callers:

- the job's user is allocated by the engine, not derived from the task id: a task id that an
  earlier version would have given another tenant's user (found here by the test itself) gets a
  user of its own, and its job sees neither the other job's processes, nor their environment,
  nor its files;
- every process of a job dies with it: a ``setsid`` child after the job's timeout, and after a
  cancel;
- a job without network reaches no host socket by path either: /tmp, /run and /dev/shm are its
  own, and an abstract socket is in another network namespace.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RunningEngine
from tests.security.conftest import as_caller, tenant_task
from tests.support.helpers import (
    JOB_PYTHON,
    job_pids,
    open_to_jobs,
    shell_step,
    step,
    unique_sleep,
    wait_for_status,
)
from workflow_engine.config import JOB_UID_BASE, JOB_UID_COUNT
from workflow_engine.v1 import workflow_engine_pb2 as pb

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="jobs run as users of their own only when the engine is root"
)


def old_uid(task_id: str) -> int:
    """The job user an earlier version derived from the task id (the hole)."""
    digest = int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:8], "big")
    return JOB_UID_BASE + digest % JOB_UID_COUNT


def colliding_task_ids() -> tuple[str, str]:
    """Two task ids the old formula maps to one user (a birthday search: a few thousand)."""
    seen: dict[int, str] = {}
    while True:
        task_id = str(uuid.uuid4())
        uid = old_uid(task_id)
        if uid in seen:
            return seen[uid], task_id
        seen[uid] = task_id


async def stdout_of(served: RunningEngine, task_id: str, who: str) -> dict[str, str]:
    """Each passed step's stdout, once the workflow has ended."""
    wf = await wait_for_status(served.stub, task_id, metadata=as_caller(who))
    return {r["step_id"]: r["stdout"] for r in wf.state["results"]}


async def test_a_task_id_chosen_to_collide_gets_a_user_and_processes_of_its_own(
    served: RunningEngine, tmp_path: Path
) -> None:
    a_id, b_id = colliding_task_ids()
    assert old_uid(a_id) == old_uid(b_id)
    secret = "a-secret-" + uuid.uuid4().hex
    told = open_to_jobs(tmp_path / "told")
    # Tenant A: a job that holds a secret in its environment and in a file, and stays.
    a_task = tenant_task(
        "project-a",
        shell_step("hold", f"echo {secret} > mine.txt; id -u > {told}/a-uid; sleep 20"),
    )
    a_task.steps[0].env["TOKEN"] = secret
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=a_id, task=a_task), metadata=as_caller("a-orchestrator")
    )
    await asyncio.sleep(1.0)  # A's job runs
    # Tenant B: looks for A's processes, their environment and working directories, and for
    # A's job directory next to its own.
    look = (
        "id -u; ls /proc | grep -c '^[0-9]'; "
        "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep TOKEN; "
        "cat /proc/[0-9]*/cwd/mine.txt 2>/dev/null; "
        "ls -a ..; ls ../.. 2>&1; cat ../../*/work/mine.txt 2>&1; true"
    )
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(
            task_id=b_id, task=tenant_task("project-b", shell_step("look", look))
        ),
        metadata=as_caller("b-orchestrator"),
    )
    seen = (await stdout_of(served, b_id, "b-orchestrator"))["look"]
    assert secret not in seen
    b_uid, processes = seen.split()[:2]
    assert int(processes) <= 4  # its own init, shell and pipeline: no process of A's
    assert (told / "a-uid").read_text().strip() != b_uid
    await served.stub.CancelWorkflow(
        pb.CancelWorkflowRequest(task_id=a_id), metadata=as_caller("a-orchestrator")
    )


@pytest.mark.parametrize("ended_by", ["timeout", "cancel"])
async def test_no_process_of_a_job_outlives_it(served: RunningEngine, ended_by: str) -> None:
    # `setsid` leaves the job's process group (what was killed before); the PID namespace
    # still holds it.
    sleeper = unique_sleep(124)
    script = f"setsid sleep {sleeper} & sleep 30"
    long_step = shell_step("escape", script, timeout_seconds=2 if ended_by == "timeout" else 60)
    task_id = str(uuid.uuid4())
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=tenant_task("project-a", long_step)),
        metadata=as_caller("a-orchestrator"),
    )
    for _ in range(200):
        if job_pids(sleeper):
            break
        await asyncio.sleep(0.05)
    assert job_pids(sleeper), "the setsid child never started"
    if ended_by == "cancel":
        await served.stub.CancelWorkflow(
            pb.CancelWorkflowRequest(task_id=task_id), metadata=as_caller("a-operator")
        )
    wf = await wait_for_status(served.stub, task_id, metadata=as_caller("a-orchestrator"))
    assert wf.status in (pb.FAILED, pb.CANCELLED)
    for _ in range(100):
        if not job_pids(sleeper):
            break
        await asyncio.sleep(0.05)
    assert job_pids(sleeper) == [], "a process of the job outlived it"


async def test_a_tasks_jobs_share_a_tmp_no_other_task_sees(served: RunningEngine) -> None:
    mark = uuid.uuid4().hex
    mine, other = str(uuid.uuid4()), str(uuid.uuid4())
    spec = tenant_task(
        "project-a",
        shell_step("write", f"echo {mark} > /tmp/mark; echo {mark} > /dev/shm/mark"),
        shell_step("read", "cat /tmp/mark /dev/shm/mark"),
    )
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=mine, task=spec), metadata=as_caller("a-orchestrator")
    )
    assert (await stdout_of(served, mine, "a-orchestrator"))["read"] == f"{mark}\n{mark}\n"
    look = tenant_task("project-b", shell_step("look", "ls -A /tmp /dev/shm; cat /tmp/mark; true"))
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=other, task=look), metadata=as_caller("b-orchestrator")
    )
    assert mark not in (await stdout_of(served, other, "b-orchestrator"))["look"]


@pytest.fixture
def host_sockets(tmp_path: Path) -> Iterator[list[str]]:
    """Unix sockets anyone may connect to, as a host's services leave them: in /run, /tmp and
    /dev/shm by path, and an abstract one."""
    listening = []
    names = []
    for where in ("/run", "/tmp", "/dev/shm"):
        directory = Path(where) / f"we-test-{uuid.uuid4().hex[:8]}"
        directory.mkdir(mode=0o777)
        directory.chmod(0o777)
        path = str(directory / "s.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        Path(path).chmod(0o777)
        server.listen()
        listening.append((server, directory))
        names.append(path)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"\0we-test-{uuid.uuid4().hex[:8]}"
    abstract.bind(name)
    abstract.listen()
    names.append(name)
    try:
        yield names
    finally:
        abstract.close()
        for server, directory in listening:
            server.close()
            for entry in directory.iterdir():
                entry.unlink()
            directory.rmdir()


async def test_no_host_socket_is_reachable_from_a_job(
    served: RunningEngine, host_sockets: list[str], tmp_path: Path
) -> None:
    # The job tries each: it may only say why it could not connect.
    probe = (
        "import socket, sys\n"
        "for name in sys.argv[1:]:\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    try:\n"
        "        s.connect(name.replace('@', chr(0)))\n"
        "        print('reached', name)\n"
        "    except OSError as e:\n"
        "        print('refused', type(e).__name__)\n"
    )
    shared = open_to_jobs(tmp_path / "shared")
    (shared / "probe.py").write_text(probe)
    names = [n.replace("\0", "@") for n in host_sockets]
    task_id = str(uuid.uuid4())
    spec = tenant_task(
        "project-a",
        step("look", JOB_PYTHON, str(shared / "probe.py"), *names),
        shell_step("sees", "ls -A /tmp /run /dev/shm | grep -v ':$' | grep -c . || true"),
    )
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=spec), metadata=as_caller("a-orchestrator")
    )
    results = await stdout_of(served, task_id, "a-orchestrator")
    said = results["look"].splitlines()
    assert len(said) == len(names) and all(line.startswith("refused") for line in said), said
    assert results["sees"].strip() == "0"  # its /tmp, /run and /dev/shm are empty
