"""A step's environment reaches its command, and nothing that runs as root.

Attacker: a tenant (or a model writing steps) who sets a step's `env`. The loader reads
``LD_PRELOAD`` (and its kin) from the environment of every dynamically linked program it
starts; if the job's environment reached a process that still runs as root (a dynamically
linked ``jobwrap``), a library of the tenant's would run as root. These tests go below the
API's own refusal of such names (another layer) and hand the sandbox the job as a worker node
or a stored workflow would. Where ``jobwrap`` is not built no job runs at all: the sandbox
refuses to start (`tests/unit/capabilities/test_factory.py`).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.helpers import granted_confinement, open_to_jobs
from workflow_engine.capabilities import LocalSandboxWorker
from workflow_engine.domain import JobRequest, Sandbox
from workflow_engine.sandbox import _wrapper as wrapper
from workflow_engine.sandbox._wrapper import WRAPPER_ENV

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the engine runs jobs as root here")

# A library whose constructor says who it ran as: a file `as-root`, or `as-<uid>`.
SNITCH = r"""
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void snitch(void) {
    char path[4096];
    if (geteuid() == 0) snprintf(path, sizeof path, "%s/as-root", MARKS);
    else snprintf(path, sizeof path, "%s/as-%u", MARKS, (unsigned)geteuid());
    FILE *f = fopen(path, "a");
    if (f) { fputs("x\n", f); fclose(f); }
}
"""


@pytest.fixture
def snitch(tmp_path: Path) -> tuple[Path, Path]:
    """The library (readable by every user) and the directory where it leaves its marks."""
    marks = open_to_jobs(tmp_path / "marks")
    source = tmp_path / "snitch.c"
    source.write_text(SNITCH)
    library = tmp_path / "lib" / "snitch.so"
    library.parent.mkdir()
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f'-DMARKS="{marks}"', "-o", str(library), str(source)],
        check=True,
    )
    library.parent.chmod(0o755)
    library.chmod(0o755)
    return library, marks


def request(*command: str, env: dict[str, str]) -> JobRequest:
    return JobRequest(
        task_id=str(uuid.uuid4()),
        job_id=str(uuid.uuid4()),
        sandbox=Sandbox(command=command, env=env, timeout_seconds=30),
    )


@pytest.mark.parametrize("linked", ["as built", "dynamically"])
async def test_ld_preload_in_a_step_env_runs_as_the_job_never_as_root(
    tmp_path: Path, snitch: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, linked: str
) -> None:
    library, marks = snitch
    if linked == "dynamically":  # as a build without a static C library makes it
        dynamic = tmp_path / "jobwrap"
        source = wrapper.JOBWRAP.with_name("jobwrap.c")
        await asyncio.to_thread(
            subprocess.run, ["gcc", "-O2", "-o", str(dynamic), str(source)], check=True
        )
        monkeypatch.setattr(wrapper, "JOBWRAP", dynamic)
    async with LocalSandboxWorker(
        jobs_dir=tmp_path / "jobs", confinement=granted_confinement()
    ) as sandbox:
        # `id` and `sh` are dynamically linked: the library runs in them, as the job's user.
        result = await sandbox.run("local", request("id", "-u", env={"LD_PRELOAD": str(library)}))
    assert result.status == "completed", result.stderr
    job_uid = result.stdout.strip()
    assert sorted(p.name for p in marks.iterdir()) == [f"as-{job_uid}"]  # never as-root


async def test_the_wrapper_runs_with_its_fixed_environment_only(tmp_path: Path) -> None:
    job = request("sleep", "5", env={"LD_PRELOAD": "/nowhere.so", "SECRET": "tenant-value"})
    async with LocalSandboxWorker(
        jobs_dir=tmp_path / "jobs", confinement=granted_confinement()
    ) as sandbox:
        running = asyncio.ensure_future(sandbox.run("local", job))
        claim = tmp_path / "jobs" / job.job_id / "supervisor.pid"
        for _ in range(200):
            if claim.exists() and claim.read_text().strip():
                break
            await asyncio.sleep(0.02)
        wrapper_pid = int(claim.read_text())
        environ = Path(f"/proc/{wrapper_pid}/environ").read_bytes().split(b"\0")
        await sandbox.cancel("local", job)
        await running
    assert {e.decode() for e in environ if e} == {f"{k}={v}" for k, v in WRAPPER_ENV.items()}


async def test_an_env_entry_that_would_split_in_two_is_refused(tmp_path: Path) -> None:
    # A NUL inside a value would end the entry early and start another variable of the
    # attacker's choosing (in the job's own process only, but it is not what the step said).
    async with LocalSandboxWorker(
        jobs_dir=tmp_path / "jobs", confinement=granted_confinement()
    ) as sandbox:
        result = await sandbox.run(
            "local", request("env", env={"A": "x\0LD_PRELOAD=/evil.so", "B=C": "d"})
        )
    assert result.status == "failed"
    assert "cannot be passed to a command as one variable" in result.stderr
