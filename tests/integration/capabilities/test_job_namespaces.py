"""A task's local jobs share one network namespace (and, not as root, one user namespace);
another task's jobs, and the engine, are never in it.

Real `jobwrap` processes through the local sandbox's runner, and `TaskNamespaces` itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import uuid
from pathlib import Path

import psutil
import pytest
from structlog.testing import capture_logs

from tests.support.helpers import JOB_PYTHON
from workflow_engine.capabilities import LocalSandboxWorker
from workflow_engine.domain import JobRequest, Sandbox
from workflow_engine.sandbox import Confinement
from workflow_engine.sandbox import _namespaces as job_namespaces
from workflow_engine.sandbox import _wrapper as wrapper
from workflow_engine.sandbox._namespaces import TaskNamespaces

pytestmark = pytest.mark.timeout(60)
#: None: each task's own user when this runs as root (CI), and a network namespace; False: a
#: user namespace with a network namespace in it, as an engine that is not root isolates.
OWN_USERS = [None, False]
SHOW_NAMESPACES = "readlink /proc/self/ns/net /proc/self/ns/user"


async def namespaces_of(worker: LocalSandboxWorker, task_id: str, command: str = "") -> list[str]:
    """The network and user namespaces a job of `task_id` ran in."""
    request = JobRequest(
        task_id=task_id,
        job_id=str(uuid.uuid4()),
        sandbox=Sandbox(command=("sh", "-c", command or SHOW_NAMESPACES)),
    )
    result = await worker.run("local", request)
    assert result.status == "completed", result
    return result.stdout.split()


@pytest.mark.parametrize("own_users", OWN_USERS)
async def test_a_tasks_jobs_share_its_namespaces_and_no_other_task_enters_them(
    tmp_path: Path, own_users: bool | None
) -> None:
    confinement = Confinement(own_users=own_users)
    async with LocalSandboxWorker(jobs_dir=tmp_path / "jobs", confinement=confinement) as worker:
        together = await asyncio.gather(*(namespaces_of(worker, "task-a") for _ in range(3)))
        later = await namespaces_of(worker, "task-a")
        other = await namespaces_of(worker, "task-b")
    engine = [os.readlink("/proc/self/ns/net"), os.readlink("/proc/self/ns/user")]
    first = together[0]
    assert first[0] != engine[0]  # never the engine's network
    assert other[0] not in (engine[0], first[0])  # nor another task's
    if own_users is False:
        assert first[1] != engine[1] and other[1] not in (engine[1], first[1])
    assert together == [first] * 3 and later == first


@pytest.mark.parametrize("own_users", OWN_USERS)
async def test_jobs_in_their_tasks_namespace_still_have_no_network(
    tmp_path: Path, own_users: bool | None
) -> None:
    # The first job makes the task's namespaces, the second enters them: neither connects.
    listener = socket.create_server(("127.0.0.1", 0))
    connect = (
        f"{JOB_PYTHON} -c \"import socket; socket.create_connection(('127.0.0.1', "
        f'{listener.getsockname()[1]}), timeout=3)" 2>&1 | tail -n 1'
    )
    confinement = Confinement(own_users=own_users)
    with listener:
        async with LocalSandboxWorker(jobs_dir=tmp_path / "jobs", confinement=confinement) as w:
            said = [" ".join(await namespaces_of(w, "task-a", connect)) for _ in range(2)]
    assert said == ["OSError: [Errno 101] Network is unreachable"] * 2


def namespace_of(fd: int) -> int:
    return os.stat(f"/proc/self/fd/{fd}").st_ino


def descriptors_naming(inode: int) -> int:
    """How many of this process's descriptors name the namespace `inode`."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.stat(f"/proc/self/fd/{name}").st_ino == inode
        except OSError:
            continue  # the listing's own descriptor
    return count


async def test_idle_namespaces_are_let_go_and_made_again() -> None:
    namespaces = TaskNamespaces(str(wrapper.JOBWRAP), idle_seconds=0.2)
    try:
        (first,) = await namespaces.for_task("task-a", "net")
        kept = os.dup(first)  # keeps it alive, so its inode number cannot come back
        assert await namespaces.for_task("task-a", "net") == (first,)  # while in use
        await asyncio.sleep(0.3)
        (again,) = await namespaces.for_task("task-a", "net")
        assert namespace_of(again) != namespace_of(kept)
        assert descriptors_naming(namespace_of(kept)) == 1  # ours alone: the engine let go
        os.close(kept)
    finally:
        namespaces.close()


async def test_beyond_the_most_held_the_least_recently_used_are_let_go() -> None:
    namespaces = TaskNamespaces(str(wrapper.JOBWRAP), most=2)
    try:
        held = {}
        for task in ("a", "b", "a", "c"):  # b is the least recently used when c comes
            (fd,) = await namespaces.for_task(task, "net")
            held[task] = namespace_of(fd)
        await namespaces.for_task("d", "net")  # three held: b, the oldest, is let go
        assert descriptors_naming(held["b"]) == 0
        assert descriptors_naming(held["a"]) == descriptors_naming(held["c"]) == 1
    finally:
        namespaces.close()


async def test_namespaces_that_cannot_be_made_leave_each_job_to_make_its_own() -> None:
    with capture_logs() as logs:
        assert await TaskNamespaces(str(wrapper.JOBWRAP)).for_task("a", "bogus") == ()
        assert await TaskNamespaces("/nonexistent/jobwrap").for_task("a", "net") == ()
    reasons = [e["reason"] for e in logs if e["event"] == "sandbox_task_namespaces_unavailable"]
    assert "--namespaces takes net or userns" in reasons[0]
    assert "/nonexistent/jobwrap did not start" in reasons[1]


def helpers(but: frozenset[int] = frozenset()) -> list[psutil.Process]:
    """This process's live `jobwrap --namespaces` helpers (not a child that has just ended
    and not yet been reaped: psutil cannot read a zombie's command line), but those in `but`
    (the helpers of runners that other tests in this process left open)."""
    found = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.ZombieProcess, psutil.NoSuchProcess):
            if (
                child.pid not in but
                and "--namespaces" in child.cmdline()
                and child.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(child)
    return found


async def test_a_helper_that_dies_is_replaced_and_jobs_run_meanwhile(tmp_path: Path) -> None:
    others = frozenset(p.pid for p in helpers())
    async with LocalSandboxWorker(jobs_dir=tmp_path / "jobs") as worker:
        first = await namespaces_of(worker, "task-a")
        (helper,) = helpers(others)
        helper.kill()
        helper.wait(5)
        # Its death is noticed at the latest by the next request; that job isolates itself.
        during = await namespaces_of(worker, "task-b")
        after = [await namespaces_of(worker, task) for task in ("task-c", "task-c")]
        (replacement,) = helpers(others)
    assert replacement.pid != helper.pid
    assert during[0] != first[0] and after[0] == after[1] != first[0]
    assert not helpers(others)  # closing the runner let its helper go


async def test_out_of_descriptors_the_job_makes_its_own_and_nothing_hangs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The helper makes and sends the namespaces; keeping them fails (EMFILE, injected).
    def out_of_descriptors(*args: object) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(job_namespaces.fcntl, "fcntl", out_of_descriptors)
    namespaces = TaskNamespaces(str(wrapper.JOBWRAP))
    try:
        with capture_logs() as logs:
            assert await asyncio.wait_for(namespaces.for_task("a", "net"), 10) == ()
    finally:
        namespaces.close()
    (event,) = [e for e in logs if e["event"] == "sandbox_task_namespaces_unavailable"]
    assert "cannot keep the namespaces it made" in event["reason"]
    assert "Too many open files" in event["reason"]
