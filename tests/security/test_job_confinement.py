"""A job gets nothing of the root process that starts it but what it was granted.

Attackers: a tenant who writes steps (or a model writing them), whose job runs as a user of its
own under an engine that runs as root. What a root process holds besides its files, and a job
must not inherit:

- a descriptor the engine holds open without close-on-exec (socket activation, a log pipe): a
  root-only file the job could read through it (``cat <&7``);
- the engine's session keyring (systemd gives each service one; Kerberos keeps tickets there),
  which a job would possess, and so read, after dropping to its own user;
- System V IPC: a segment one tenant's job leaves behind, another tenant's job would attach to,
  and the host's (PostgreSQL's) it would see;
- setuid programs: without ``no_new_privs`` a job runs one with the privileges of its owner.

Each test plays the attack through a served engine and fails if the job gets the thing.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import random
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import RunningEngine, start_engine, stop_engine
from tests.security.conftest import as_caller, tenant_task
from tests.support.helpers import JOB_PYTHON, open_to_jobs, shell_step, step, wait_for_status
from workflow_engine.config import JobSettings, Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="jobs run as users of their own only when the engine is root"
)

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
LIBC.shmat.restype = ctypes.c_void_p
LIBC.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
IPC_CREAT, IPC_RMID = 0o1000, 0


async def run_alone(served: RunningEngine, project: str, *steps: pb.Step) -> dict[str, str]:
    """Run a task of `project` made of `steps`; each step's stdout once it has ended."""
    task_id = str(uuid.uuid4())
    who = "a-orchestrator" if project == "project-a" else "b-orchestrator"
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=tenant_task(project, *steps)),
        metadata=as_caller(who),
    )
    wf = await wait_for_status(served.stub, task_id, metadata=as_caller(who))
    return {r["step_id"]: r["stdout"] for r in wf.state["results"]}


def python_step(step_id: str, program: str, *args: str) -> pb.Step:
    return step(step_id, JOB_PYTHON, "-c", program, *args)


@pytest.fixture
def inherited_secret(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """A root-only file's secret, open in this process (the engine's) on a descriptor that is
    not close-on-exec, as socket activation or a log pipe leaves one."""
    secret = "held-open-" + uuid.uuid4().hex
    path = tmp_path / "root-only"
    path.write_text(secret)
    path.chmod(0o600)
    fd = os.open(path, os.O_RDONLY)
    os.set_inheritable(fd, True)
    try:
        yield fd, secret
    finally:
        os.close(fd)


async def test_a_descriptor_the_engine_holds_open_reaches_no_job(
    served: RunningEngine, inherited_secret: tuple[int, str]
) -> None:
    fd, secret = inherited_secret
    probe = (
        "import os, sys\n"
        "held = []\n"
        "for fd in range(3, 4096):\n"
        "    try:\n"
        "        os.fstat(fd)\n"
        "    except OSError:\n"
        "        continue\n"
        "    held.append(fd)\n"
        "print('held', held)\n"
        "try:\n"
        "    print('read', os.read(int(sys.argv[1]), 100).decode())\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
    )
    seen = await run_alone(served, "project-a", python_step("probe", probe, str(fd)))
    assert secret not in json.dumps(seen), seen
    assert seen["probe"].startswith("held []\nrefused"), seen["probe"]


@pytest.fixture
def engine_keyring_key() -> Iterator[int]:
    """A key in this process's session keyring (the engine's, as systemd gives a service one):
    its serial. The event loop's thread, which starts the jobs, joins a new session keyring for
    it, and another when the test ends."""
    if platform.machine() != "x86_64":
        pytest.skip("the keyctl system call numbers here are x86-64's")
    keyctl, add_key = 250, 248
    if LIBC.syscall(keyctl, 1, None) < 0:  # KEYCTL_JOIN_SESSION_KEYRING
        pytest.skip(f"no keyrings here: errno {ctypes.get_errno()}")
    payload = ("kerberos-ticket-" + uuid.uuid4().hex).encode()
    serial = LIBC.syscall(add_key, b"user", b"we-test", payload, len(payload), -3)
    assert serial > 0, ctypes.get_errno()
    try:
        yield serial
    finally:
        LIBC.syscall(keyctl, 3, ctypes.c_long(serial))  # KEYCTL_REVOKE
        LIBC.syscall(keyctl, 1, None)


async def test_the_engines_session_keyring_is_not_the_jobs(
    served: RunningEngine, engine_keyring_key: int
) -> None:
    probe = (
        "import ctypes, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "buf = ctypes.create_string_buffer(200)\n"
        "n = libc.syscall(250, 11, ctypes.c_long(int(sys.argv[1])), buf, 200)\n"  # KEYCTL_READ
        "print('read', buf.value.decode()) if n >= 0 else print('refused', ctypes.get_errno())\n"
    )
    seen = await run_alone(
        served, "project-a", python_step("probe", probe, str(engine_keyring_key))
    )
    assert seen["probe"].startswith("refused"), seen["probe"]


SHM_WRITE = (
    "import ctypes, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.shmat.restype = ctypes.c_void_p\n"
    "libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]\n"
    "mark = sys.argv[2].encode()\n"
    "shm = libc.shmget(int(sys.argv[1]), 4096, 0o1666)\n"
    "ctypes.memmove(libc.shmat(shm, None, 0), mark, len(mark))\n"
    "print('left', shm)\n"
)
SHM_READ = (
    "import ctypes, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.shmat.restype = ctypes.c_void_p\n"
    "libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]\n"
    "for key in sys.argv[1:]:\n"
    "    shm = libc.shmget(int(key), 0, 0)\n"
    "    if shm < 0:\n"
    "        print('none', ctypes.get_errno())\n"
    "    else:\n"
    "        print('read', ctypes.string_at(libc.shmat(shm, None, 0), 40))\n"
    "print('segments', len(open('/proc/sysvipc/shm').read().splitlines()) - 1)\n"
)


@pytest.fixture
def shm_keys() -> Iterator[tuple[int, int, str]]:
    """A key for a tenant's job's segment, and the key of a segment of the host's (made here,
    holding a mark): what a job must not see. Both are removed at the end, whoever made them."""
    job_key, host_key = random.sample(range(1 << 20, 1 << 30), 2)
    host_mark = "host-" + uuid.uuid4().hex
    host = LIBC.shmget(host_key, 4096, IPC_CREAT | 0o666)
    assert host >= 0, ctypes.get_errno()
    ctypes.memmove(LIBC.shmat(host, None, 0), host_mark.encode(), len(host_mark))
    try:
        yield job_key, host_key, host_mark
    finally:
        for key in (job_key, host_key):
            shm = LIBC.shmget(key, 0, 0)
            if shm >= 0:
                LIBC.shmctl(shm, IPC_RMID, None)


async def test_no_ipc_segment_passes_between_jobs_or_from_the_host(
    served: RunningEngine, shm_keys: tuple[int, int, str]
) -> None:
    job_key, host_key, host_mark = shm_keys
    a_mark = "tenant-a-" + uuid.uuid4().hex
    left = await run_alone(
        served, "project-a", python_step("leave", SHM_WRITE, str(job_key), a_mark)
    )
    assert left["leave"].startswith("left")
    seen = await run_alone(
        served, "project-b", python_step("look", SHM_READ, str(job_key), str(host_key))
    )
    assert a_mark not in seen["look"] and host_mark not in seen["look"], seen["look"]
    assert seen["look"].splitlines() == ["none 2", "none 2", "segments 0"], seen["look"]
    assert LIBC.shmget(job_key, 0, 0) < 0  # A's segment went with its job


@pytest.fixture
def setuid_id() -> Iterator[Path]:
    """`id`, setuid root, where a job can run it (a host's setuid programs are like it)."""
    directory = Path("/var/tmp") / f"we-test-{uuid.uuid4().hex[:8]}"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    program = directory / "id"
    id_path = shutil.which("id")
    assert id_path is not None
    shutil.copy(id_path, program)
    program.chmod(0o4755)
    try:
        yield program
    finally:
        shutil.rmtree(directory)


async def test_a_setuid_program_gives_a_job_no_privilege(
    served: RunningEngine, setuid_id: Path
) -> None:
    if os.statvfs(setuid_id).f_flag & os.ST_NOSUID:
        pytest.skip(f"{setuid_id.parent} is mounted nosuid: no setuid program runs there")
    script = f"id -u; {setuid_id} -u; grep NoNewPrivs /proc/self/status; true"
    seen = await run_alone(served, "project-a", shell_step("escalate", script))
    own, escalated, _, no_new_privs = seen["escalate"].split()
    assert own != "0" and escalated == own, seen["escalate"]
    assert no_new_privs == "1", seen["escalate"]


@pytest.fixture
def planted() -> Iterator[Path]:
    """A directory of the host's that any user may write in (a job sees it read-only: see
    `test_a_job_writes_nothing_of_the_hosts_but_what_it_was_given`), removed at the end with
    whatever is in it."""
    path = Path("/var/tmp") / f"we-planted-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def served_from_tmp(secured: Settings) -> AsyncIterator[RunningEngine]:
    """A served engine whose data directory, so its jobs directory, is beneath /tmp, which
    each job's /tmp covers: its init makes the jobs directory's path again in there."""
    data_dir = Path(tempfile.mkdtemp(prefix="we-data-", dir="/tmp"))
    running = await start_engine(replace(secured, data_dir=data_dir))
    try:
        yield running
    finally:
        await stop_engine(running)
        shutil.rmtree(data_dir, ignore_errors=True)


async def test_a_link_planted_in_the_tasks_tmp_sends_root_nowhere(
    served_from_tmp: RunningEngine, planted: Path
) -> None:
    # Step 1 moves the jobs directory's path (as its init made it in the task's /tmp) aside
    # and plants `.../jobs` as a link to a directory of the host's; step 2's init, as root,
    # must not follow it (it made `<planted>/<job id>` on the host).
    plant = (
        'jobs=$(dirname "$(dirname "$PWD")"); top=/tmp/$(echo "$jobs" | cut -d/ -f3); '
        f"mkdir -p -m 777 {planted} && "
        'mv "$top" "$top.moved" && mkdir -p "$(dirname "$jobs")" && '
        f'ln -s {planted} "$jobs" && echo planted "$jobs"'
    )
    task_id = str(uuid.uuid4())
    spec = tenant_task("project-a", shell_step("plant", plant), shell_step("next", "true"))
    spec.steps[1].depends_on.append("plant")
    spec.max_attempts_per_step = 1
    stub = served_from_tmp.stub
    await stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=spec), metadata=as_caller("a-orchestrator")
    )
    wf = await wait_for_status(stub, task_id, metadata=as_caller("a-orchestrator"))
    plant_result = wf.state["steps"]["plant"]["result"]
    assert plant_result["stdout"].startswith("planted /tmp/we-data-"), plant_result["stderr"]
    assert planted.is_dir()
    assert list(planted.iterdir()) == []  # nothing of root's was made through the link


SYSCALLS = (
    "import ctypes, errno, os, threading\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "def call(nr, *args):\n"
    "    return 0 if libc.syscall(nr, *args) >= 0 else ctypes.get_errno()\n"
    "seen = {\n"
    "    'unshare_user': call(272, 0x10000000),\n"  # a user namespace: the kernel's surface
    "    'clone_newuser': call(56, 0x10000000 | 17, 0, 0, 0, 0),\n"
    "    'clone3': call(435, 0, 0),\n"
    "    'io_uring_setup': call(425, 1, 0),\n"
    "    'perf_event_open': call(298, 0, 0, -1, -1, 0),\n"
    "    'bpf': call(321, 0, 0, 0),\n"
    "    'userfaultfd': call(323, 0),\n"
    "    'mount': call(165, 0, 0, 0, 0, 0),\n"
    "    'open_by_handle_at': call(304, 0, 0, 0),\n"
    "}\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os._exit(0)\n"
    "seen['fork'] = os.waitpid(pid, 0)[1] >> 8\n"
    "t = threading.Thread(target=lambda: None)\n"
    "t.start()\n"
    "t.join()\n"
    "print(' '.join(f'{k}={errno.errorcode.get(v, v) if v else 0}' for k, v in seen.items()))\n"
)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the probe's numbers are x86_64's")
async def test_a_job_cannot_reach_the_kernels_less_travelled_paths(served: RunningEngine) -> None:
    """Issue 61, part 2: no seccomp filter let a job make a user namespace (the kernel's
    largest surface open to an unprivileged user), set up io_uring, open perf events and the
    like. Each is refused with EPERM now (clone3 ENOSYS, so the C library falls back to
    clone, which is allowed without namespace flags); fork and threads work as before."""
    seen = await run_alone(served, "project-a", python_step("probe", SYSCALLS))
    assert seen["probe"].split() == [
        "unshare_user=EPERM",
        "clone_newuser=EPERM",
        "clone3=ENOSYS",
        "io_uring_setup=EPERM",
        "perf_event_open=EPERM",
        "bpf=EPERM",
        "userfaultfd=EPERM",
        "mount=EPERM",
        "open_by_handle_at=EPERM",
        "fork=0",
    ], seen["probe"]


@pytest.fixture
def drop_directory() -> Iterator[Path]:
    """A world-writable directory of the host's that no job was granted (as /var/tmp is)."""
    path = Path(tempfile.mkdtemp(prefix="we-drop-", dir="/var/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def test_a_job_writes_nothing_of_the_hosts_but_what_it_was_given(
    served: RunningEngine, drop_directory: Path, tmp_path: Path
) -> None:
    """Issue 61, part 2: a job saw the host's files as any user does, so it could write into a
    world-writable directory of the host (/var/tmp, a drop directory), where another tenant's
    job could read what it left (files are world-readable by default). Now the host's files
    are read-only for it but for the directories granted to every job
    (``WORKFLOW_ENGINE_JOB_WRITABLE_PATHS``: here pytest's, where `granted` is); its work
    directory, /tmp and /dev/null are written as before."""
    granted = open_to_jobs(tmp_path / "granted")
    mark = "left-" + uuid.uuid4().hex
    script = (
        f"{{ echo x > {drop_directory}/{mark}; }} 2>&1; "
        f"echo x > {granted}/{mark} && echo granted-ok; "
        "echo x > /tmp/t && echo x > here && echo x > /dev/null && echo own-ok"
    )
    seen = await run_alone(served, "project-a", shell_step("write", script))
    lines = seen["write"].splitlines()
    assert lines[0].endswith("Read-only file system"), seen["write"]
    assert lines[1:] == ["granted-ok", "own-ok"], seen["write"]
    assert not (drop_directory / mark).exists()
    assert (granted / mark).read_text() == "x\n"


@pytest.fixture
def read_only_beneath(drop_directory: Path, tmp_path: Path) -> Iterator[Path]:
    """A read-only filesystem (a bind of ``dataset`` in pytest's directory) mounted at
    ``data`` beneath `drop_directory`, a world-writable directory of the host's."""
    data = drop_directory / "data"
    source = tmp_path / "dataset"
    source.mkdir()
    (source / "model.txt").write_text("original\n")
    data.mkdir()
    mount = ["mount", "--bind", str(source), str(data)]
    if subprocess.run(mount, check=False).returncode != 0:
        pytest.skip("cannot mount a read-only filesystem beneath the granted directory here")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(data)], check=True)
        yield data
    finally:
        subprocess.run(["umount", str(data)], check=False)


@pytest.fixture
async def served_granting(
    secured: Settings, tmp_path: Path, drop_directory: Path, read_only_beneath: Path
) -> AsyncIterator[RunningEngine]:
    """A served engine granting its jobs `drop_directory` (and pytest's directory)."""
    grants = f"{drop_directory}:{tmp_path}"
    running = await start_engine(replace(secured, job=JobSettings(writable_paths=grants)))
    try:
        yield running
    finally:
        await stop_engine(running)


async def test_a_grant_makes_writable_only_its_own_filesystem_and_follows_no_link(
    served_granting: RunningEngine, drop_directory: Path, tmp_path: Path
) -> None:
    """Found by issue 61's own round: a granted directory was bound onto itself recursively and
    made writable recursively, so a read-only filesystem mounted beneath it became writable to
    jobs (and a job changed the host's copy); and its path was followed through links, so a
    link a job planted where a grant's path goes made the whole host writable again. Now only
    the grant's own mount is made writable, and a path through a link is never followed
    (nested grants, where a job could plant one, are refused by the settings)."""
    script = (
        f"echo ok > {drop_directory}/mine && echo granted-ok; "
        f"{{ echo tampered > {drop_directory}/data/model.txt; }} 2>&1; true"
    )
    seen = await run_alone(served_granting, "project-a", shell_step("write", script))
    lines = seen["write"].splitlines()
    assert lines[0] == "granted-ok", seen["write"]
    assert lines[1].endswith("Read-only file system"), seen["write"]
    assert (tmp_path / "dataset" / "model.txt").read_text() == "original\n"


async def test_a_granted_path_through_a_link_is_refused_not_followed(
    secured: Settings, tmp_path: Path
) -> None:
    link = tmp_path / "link-to-root"
    link.symlink_to("/")
    grants = f"{link}"
    running = await start_engine(replace(secured, job=JobSettings(writable_paths=grants)))
    try:
        task_id = str(uuid.uuid4())
        spec = tenant_task("project-a", shell_step("write", "echo x > /var/tmp/through-link"))
        await running.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=spec),
            metadata=as_caller("a-orchestrator"),
        )
        wf = await wait_for_status(running.stub, task_id, metadata=as_caller("a-orchestrator"))
    finally:
        await stop_engine(running)
    assert wf.status == pb.FAILED
    stderr = wf.state["steps"]["write"]["result"]["stderr"]
    assert "cannot make the host's files read-only: Not a directory" in stderr, stderr
    assert not Path("/var/tmp/through-link").exists()
