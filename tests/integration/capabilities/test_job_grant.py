"""Local jobs run with only what they were granted: their own user, limits, no network, no image,
no labels.

Real processes through the local sandbox's runner. The tests of the user a job runs as need
root (CI runs as root); the rest hold for any user the runner can isolate.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import JOB_PYTHON
from workflow_engine.capabilities import LocalSandboxWorker
from workflow_engine.capabilities._machine_verifier import MachineVerifier
from workflow_engine.config import JobLimits
from workflow_engine.domain import JobRequest, JobResult, Limits, Sandbox, Step
from workflow_engine.sandbox import Confinement

pytestmark = pytest.mark.timeout(60)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="jobs get their own user only under root")
UID_BASE = 1_500_000_000


def job(*command: str, **sandbox: Any) -> JobRequest:
    return JobRequest(
        task_id=str(uuid.uuid4()),
        job_id=str(uuid.uuid4()),
        sandbox=Sandbox(command=command, **sandbox),
    )


@pytest.fixture
async def sandbox(tmp_path: Path) -> AsyncIterator[LocalSandboxWorker]:
    confinement = Confinement(JobLimits(memory_mb=2048), uid_base=UID_BASE, uid_count=1000)
    async with LocalSandboxWorker(jobs_dir=tmp_path / "jobs", confinement=confinement) as worker:
        yield worker


async def finding_of(result: JobResult) -> str:
    """What the machine verifier says of a result whose step expects exit code 0."""
    step = Step(id="s", command=("x",))
    verification = await MachineVerifier().verify(step, result, [])
    return "; ".join(f.detail for f in verification.findings if not f.passed)


@as_root
async def test_a_job_of_root_runs_as_its_own_unprivileged_user(
    sandbox: LocalSandboxWorker, tmp_path: Path
) -> None:
    secret = tmp_path / "engine-only"
    secret.write_text("the engine's")
    secret.chmod(0o600)
    script = (
        "id -u; id -G; grep CapEff /proc/self/status; "
        f"cat {secret} || echo no-read; echo 0 >../exit_status || echo no-forge; exit 3"
    )
    result = await sandbox.run("local", job("sh", "-c", script))
    uid, groups, caps, read, forge = result.stdout.splitlines()
    assert UID_BASE <= int(uid) < UID_BASE + 1000
    assert groups == uid  # its own group, no supplementary ones
    assert caps.split() == ["CapEff:", "0000000000000000"]
    assert (read, forge) == ("no-read", "no-forge")
    # It could not write its own exit status: the command's own 3 is what the result says.
    assert (result.status, result.exit_code) == ("failed", 3)
    work_dir = Path(result.work_dir or "")
    assert (work_dir.stat().st_uid, work_dir.stat().st_mode & 0o777) == (int(uid), 0o700)


@as_root
async def test_two_jobs_cannot_read_each_others_files(sandbox: LocalSandboxWorker) -> None:
    first = await sandbox.run("local", job("sh", "-c", "echo mine >note; pwd"))
    other = await sandbox.run(
        "local",
        job("sh", "-c", f"cat {first.stdout.strip()}/note ../../*/request.json || echo denied"),
    )
    assert other.stdout.strip().endswith("denied")
    assert "mine" not in other.stdout


async def test_over_its_memory_limit_a_job_is_stopped_with_a_finding(
    sandbox: LocalSandboxWorker,
) -> None:
    grab = f"x = bytearray({300 * 1024 * 1024})"
    result = await sandbox.run("local", job(JOB_PYTHON, "-c", grab, limits=Limits(memory_mb=100)))
    assert (result.status, result.exit_code) == ("failed", 1)
    finding = await finding_of(result)
    assert "refused more memory than its limits allow" in finding
    assert "memory 100 MiB" in finding
    # The same job within its limit runs to the end: the limit, not the job, stopped it.
    fits = await sandbox.run("local", job(JOB_PYTHON, "-c", grab, limits=Limits(memory_mb=1024)))
    assert fits.status == "completed", fits.stderr


@as_root
async def test_over_its_process_limit_a_job_is_stopped_with_a_finding(
    sandbox: LocalSandboxWorker,
) -> None:
    fork_many = "for i in $(seq 40); do sleep 5 & done; wait"
    result = await sandbox.run("local", job("sh", "-c", fork_many, limits=Limits(processes=10)))
    assert result.status == "failed"
    finding = await finding_of(result)
    assert "refused more processes than its limits allow" in finding
    assert "processes 10" in finding


async def test_cpu_time_and_output_limits_stop_a_job(sandbox: LocalSandboxWorker) -> None:
    spin = await sandbox.run(
        "local", job(JOB_PYTHON, "-c", "while True: pass", limits=Limits(cpu_seconds=1))
    )
    assert "stopped at its CPU time limit" in await finding_of(spin)
    flood = await sandbox.run("local", job("sh", "-c", "yes >big", limits=Limits(output_mb=1)))
    assert "stopped at its output limit" in await finding_of(flood)
    assert os.path.getsize(Path(flood.work_dir or "") / "big") <= 1024 * 1024


async def test_a_step_asks_for_less_never_for_more_than_the_settings(tmp_path: Path) -> None:
    confinement = Confinement(JobLimits(memory_mb=300, open_files=64), uid_base=UID_BASE)
    async with LocalSandboxWorker(jobs_dir=tmp_path / "jobs", confinement=confinement) as worker:
        more = await worker.run(
            "local", job("sh", "-c", "ulimit -v; ulimit -n", limits=Limits(memory_mb=9000))
        )
        less = await worker.run(
            "local", job("sh", "-c", "ulimit -v; ulimit -n", limits=Limits(open_files=16))
        )
    assert more.stdout.split() == [str(300 * 1024), "64"]
    assert less.stdout.split() == [str(300 * 1024), "16"]


@pytest.mark.parametrize("policy", ["none", "restricted"])
async def test_a_job_without_network_cannot_connect_to_a_port_on_loopback(
    sandbox: LocalSandboxWorker, policy: str
) -> None:
    accepted: list[bool] = []
    server = await asyncio.start_server(
        lambda r, w: (accepted.append(True), w.close()), "127.0.0.1", 0
    )
    port = server.sockets[0].getsockname()[1]
    connect = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)"
    try:
        # The port is there: a process outside the sandbox connects.
        with socket.create_connection(("127.0.0.1", port), timeout=3):
            pass
        result = await sandbox.run("local", job(JOB_PYTHON, "-c", connect, network_policy=policy))
    finally:
        server.close()
        await server.wait_closed()
    assert result.status == "failed"
    assert "Network is unreachable" in result.stderr
    assert accepted == [True]  # only the outside connection got through


async def test_without_users_of_their_own_jobs_are_cut_off_by_a_user_namespace(
    tmp_path: Path,
) -> None:
    # How an engine that is not root (the container image's) isolates its jobs.
    confinement = Confinement(own_users=False)
    listener = socket.create_server(("127.0.0.1", 0))
    connect = (
        "import os, socket; print(os.getuid());"
        f"socket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), timeout=3)"
    )
    with listener:
        async with LocalSandboxWorker(jobs_dir=tmp_path / "jobs", confinement=confinement) as w:
            result = await w.run("local", job(JOB_PYTHON, "-c", connect, network_policy="none"))
    assert result.status == "failed" and "Network is unreachable" in result.stderr
    assert result.stdout == f"{os.getuid()}\n"  # the engine's own user, mapped


async def test_an_image_is_refused_and_nothing_runs(
    sandbox: LocalSandboxWorker, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    result = await sandbox.run("local", job("touch", str(marker), image="python:3.11"))
    assert (result.status, result.exit_code) == ("failed", None)
    assert "cannot run the image 'python:3.11'" in await finding_of(result)
    assert not marker.exists()


async def test_a_step_that_requires_labels_is_refused_and_nothing_runs(
    sandbox: LocalSandboxWorker, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    request = job("touch", str(marker)).model_copy(update={"required_labels": ("gpu", "cuda")})
    result = await sandbox.run("local", request)
    assert (result.status, result.exit_code) == ("failed", None)
    finding = await finding_of(result)
    assert "the local sandbox has no labels, and the step requires gpu, cuda" in finding
    assert "WORKFLOW_ENGINE_WORKER=nodes" in finding
    assert not marker.exists()


async def test_a_network_policy_it_cannot_enforce_refuses_the_job(
    tmp_path: Path,
) -> None:
    # An id no process can take (as root) or user namespaces (otherwise) must work: here the
    # former is made to fail, so the isolation cannot be set up.
    confinement = Confinement(uid_base=2**32 - 1, uid_count=1)
    if os.geteuid() != 0:
        pytest.skip("needs root: a non-root runner isolates without switching users")
    marker = tmp_path / "ran"
    async with LocalSandboxWorker(jobs_dir=tmp_path / "jobs", confinement=confinement) as worker:
        result = await worker.run("local", job("touch", str(marker)))
    assert (result.status, result.exit_code) == ("failed", None)
    finding = await finding_of(result)
    assert "cannot enforce network_policy 'restricted'" in finding
    assert "WORKFLOW_ENGINE_JOB_UID_BASE" in result.stderr
    assert not marker.exists()


async def test_a_job_sees_only_its_step_env_and_a_minimal_path(
    sandbox: LocalSandboxWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKFLOW_ENGINE_DATABASE_URL", "postgresql://engine:hunter2@db/x")
    result = await sandbox.run("local", job("env", env={"GREETING": "hi"}))
    names = {line.split("=", 1)[0] for line in result.stdout.splitlines()}
    engine_own = {n for n in names if n.startswith("WORKFLOW_ENGINE_")}
    assert names - engine_own == {"GREETING", "PATH", "HOME", "TMPDIR", "LANG", "PWD"}
    assert f"PWD={result.work_dir}" in result.stdout.splitlines()
    assert engine_own == {
        "WORKFLOW_ENGINE_TASK_ID",
        "WORKFLOW_ENGINE_JOB_ID",
        "WORKFLOW_ENGINE_ATTEMPT",
        "WORKFLOW_ENGINE_REMEDIATION",
        "WORKFLOW_ENGINE_CONTEXT",
    }
    assert "hunter2" not in result.stdout
