"""Job directories are kept for the retention after their result, then removed.

Real jobs in a temporary jobs directory; "older" is made by moving a file's modification time
back (`os.utime`), as time passing would. Commands that must run at most once append to a
marker file outside their work directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.helpers import granted_confinement
from workflow_engine.capabilities import LocalSandboxWorker
from workflow_engine.domain import JobRequest, Sandbox
from workflow_engine.domain.task import MAX_TIMEOUT_SECONDS
from workflow_engine.sandbox import JobRunner
from workflow_engine.sandbox import _files as files

pytestmark = pytest.mark.timeout(30)

HOUR = 3600.0


def job(job_id: str, *command: str) -> JobRequest:
    return JobRequest(task_id="task-1", job_id=job_id, sandbox=Sandbox(command=command))


def counted(job_id: str, marker: Path) -> JobRequest:
    return job(job_id, "sh", "-c", f"echo ran >> {marker}; echo out")


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def age(path: Path, seconds: float) -> None:
    """Make `path` look last changed `seconds` ago."""
    then = time.time() - seconds
    os.utime(path, (then, then))


async def test_prune_removes_only_jobs_whose_retention_has_passed(tmp_path: Path) -> None:
    jobs_dir = tmp_path / "jobs"
    runner = JobRunner(jobs_dir=jobs_dir, retention_seconds=HOUR, confinement=granted_confinement())
    marker = tmp_path / "marker"
    try:
        old = await runner.run(counted("old", marker))
        fresh = await runner.run(counted("fresh", marker))
        assert (old.status, fresh.status) == ("completed", "completed")
        age(jobs_dir / "old" / files.RESULT_FILE, HOUR + 60)
        running = asyncio.create_task(runner.run(job("running", "sleep", "30")))
        while not (jobs_dir / "running" / files.STDOUT_FILE).exists():
            await asyncio.sleep(0.02)
        # As old as any job may be, but followed here: not this runner's to remove.
        age(jobs_dir / "running", HOUR + MAX_TIMEOUT_SECONDS + 60)
        # No result: a job that may still run is kept; one older than any job may run is not.
        (jobs_dir / "recent-unfinished").mkdir()
        age(jobs_dir / "recent-unfinished", HOUR + 60)
        (jobs_dir / "ancient-unfinished").mkdir()
        age(jobs_dir / "ancient-unfinished", HOUR + MAX_TIMEOUT_SECONDS + 60)
        (jobs_dir / ".pruned-left-by-a-crash" / "work").mkdir(parents=True)

        assert await runner.prune() == 3

        assert sorted(p.name for p in jobs_dir.iterdir()) == [
            ".tmp",  # the tasks' /tmp directories
            ".users",  # the tasks' users (job_users)
            "fresh",
            "recent-unfinished",
            "running",
        ]
        assert await runner.prune() == 0
        # Within the retention a job id is answered from its first run; after it, it runs again.
        assert await runner.run(counted("fresh", marker)) == fresh
        assert lines(marker) == ["ran", "ran"]
        again = await runner.run(counted("old", marker))
        assert again.status == "completed" and again.started_at != old.started_at
        assert lines(marker) == ["ran", "ran", "ran"]
        running.cancel()
    finally:
        await runner.cancel(job("running", "sleep", "30"))
        await runner.close()


async def test_prune_removes_what_a_job_locked_and_nothing_it_links_to(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    outside.chmod(0o755)
    (outside / "keep").chmod(0o555)
    script = (
        "mkdir -p locked/inner && echo x > locked/inner/file && chmod 000 locked/inner locked"
        f" && ln -s {outside} link && ln -s {outside / 'keep'} link2"
    )
    runner = JobRunner(
        jobs_dir=tmp_path / "jobs", retention_seconds=HOUR, confinement=granted_confinement()
    )
    try:
        result = await runner.run(job("locks", "sh", "-c", script))
        assert result.status == "completed", result.stderr
        age(tmp_path / "jobs" / "locks" / files.RESULT_FILE, 2 * HOUR)
        assert await runner.prune() == 1
    finally:
        await runner.close()
    assert sorted(p.name for p in (tmp_path / "jobs").iterdir()) == [".tmp", ".users"]
    assert (outside / "keep").is_dir()
    assert (outside.stat().st_mode & 0o777, (outside / "keep").stat().st_mode & 0o777) == (
        0o755,
        0o555,
    )


async def test_the_sandbox_prunes_in_the_background_until_closed(tmp_path: Path) -> None:
    jobs_dir = tmp_path / "jobs"
    async with LocalSandboxWorker(
        jobs_dir=jobs_dir, retention_seconds=1, confinement=granted_confinement()
    ) as sandbox:
        result = await sandbox.run("local", job("soon-gone", "true"))
        assert result.status == "completed"
        deadline = time.monotonic() + 10
        while (jobs_dir / "soon-gone").exists():
            assert time.monotonic() < deadline, "the job's directory outlived its retention"
            await asyncio.sleep(0.05)
    # Closed: nothing removes a directory any more.
    (jobs_dir / "after-close").mkdir()
    age(jobs_dir / "after-close", 2 * MAX_TIMEOUT_SECONDS)
    await asyncio.sleep(0.6)
    assert (jobs_dir / "after-close").exists()


async def test_no_retention_keeps_every_directory(tmp_path: Path) -> None:
    async with LocalSandboxWorker(
        jobs_dir=tmp_path / "jobs", confinement=granted_confinement()
    ) as sandbox:
        await sandbox.run("local", job("kept", "true"))
        age(tmp_path / "jobs" / "kept" / files.RESULT_FILE, 365 * 24 * HOUR)
        await asyncio.sleep(0.6)
    assert (tmp_path / "jobs" / "kept" / files.RESULT_FILE).exists()


@pytest.mark.parametrize("seconds", [-1.0, float("nan"), float("inf")])
def test_a_retention_that_is_no_duration_is_refused(tmp_path: Path, seconds: float) -> None:
    with pytest.raises(ValueError, match="retention_seconds"):
        JobRunner(jobs_dir=tmp_path, retention_seconds=seconds, confinement=granted_confinement())


def test_a_non_root_engine_removes_directories_its_job_left_without_permissions() -> None:
    """Root may remove anything; an engine that is not root gets its permissions back first.
    As root, the removal runs as `nobody` on a tree `nobody` owns (a job's user as seen by a
    non-root engine: its own)."""
    with tempfile.TemporaryDirectory() as name:  # not under pytest's, which only root enters
        base = Path(name)
        base.chmod(0o755)
        _remove_as_the_owner(base)


def _remove_as_the_owner(base: Path) -> None:
    doomed = base / ".pruned-job"
    (doomed / "work" / "locked" / "inner").mkdir(parents=True)
    (doomed / "work" / "locked" / "inner" / "file").write_text("x")
    outside = base / "outside"
    outside.mkdir(mode=0o500)
    (doomed / "work" / "link").symlink_to(outside)
    code = (
        "import sys; from pathlib import Path;"
        "from workflow_engine.sandbox._retention import remove;"
        "remove([Path(sys.argv[1])])"
    )
    command = [sys.executable, "-c", code, str(doomed)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("root without util-linux setpriv to act as another user")
        for path in [base, *base.rglob("*")]:
            os.lchown(path, 65534, 65534)
        command = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--", *command]
    (doomed / "work" / "locked" / "inner").chmod(0)
    (doomed / "work" / "locked").chmod(0)
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "job_dir_prune_failed" not in done.stdout + done.stderr
    assert not doomed.exists()
    assert outside.is_dir() and outside.stat().st_mode & 0o777 == 0o500


async def test_prune_removes_a_tasks_tmp_once_no_job_of_it_can_run_or_be_kept(
    tmp_path: Path,
) -> None:
    runner = JobRunner(
        jobs_dir=tmp_path / "jobs", retention_seconds=HOUR, confinement=granted_confinement()
    )
    try:
        for task_id in ("task-old", "task-new"):
            request = JobRequest(
                task_id=task_id,
                job_id=f"job-of-{task_id}",
                sandbox=Sandbox(command=("sh", "-c", "echo kept > /tmp/note")),
            )
            assert (await runner.run(request)).status == "completed"
        tmps = tmp_path / "jobs" / ".tmp"
        old, new = (
            tmps / hashlib.sha256(t.encode()).hexdigest()[:32] for t in ("task-old", "task-new")
        )
        assert (old / "note").exists() and (new / "note").exists()
        # No job of `task-old` started for the retention plus the longest a job may run.
        age(old, HOUR + MAX_TIMEOUT_SECONDS + 60)
        await runner.prune()
        assert list(tmps.iterdir()) == [new]
    finally:
        await runner.close()
