"""The embedded worker: runs each job as a local process, once per job id, surviving restarts.

A job lives in ``jobs_dir/<job_id>/``. Creating that directory claims the job, so a second run
with the same id (a retry of `collect_result`, or a restarted engine) never starts the command
again; it waits for the detached supervisor's ``result.json`` instead. If the supervisor died
without a result, the job is reported lost (failed), still without running it again.

`cancel` stops a job for good: it claims the directory of a job that has not started (so it
never will, and a later `run` of that id reads the cancelled result), or marks a started one
cancelled and signals its supervisor, which stops the command's whole process group (SIGTERM,
then SIGKILL after a grace period) and records the result as cancelled.

This isolates environment and working directory only: `image` and `network_policy` are not
enforced locally. Use a remote worker where a real sandbox is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

import structlog

from workflow_engine.capabilities import _sandbox_supervisor as supervisor
from workflow_engine.domain.jobs import JobRequest, JobResult, JobStatus

log = structlog.get_logger(__name__)

TARGET = "local"
_SUPERVISOR_SCRIPT = Path(supervisor.__file__).resolve()
_MAX_POLL_INTERVAL = 0.5
# How long a job directory may exist without a supervisor pid before its launcher is presumed
# dead (it died between claiming the directory and starting the supervisor).
_CLAIM_GRACE_SECONDS = 10.0
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:=@+-]{0,127}$")
_LOG_TAIL_BYTES = 2048


class LocalSandboxWorker:
    """Runs jobs on this machine in a fresh work directory with a minimal environment."""

    def __init__(
        self,
        *,
        jobs_dir: Path,
        default_timeout_seconds: int = 3600,
        max_output_bytes: int = 64 * 1024,
        poll_interval: float = 0.05,
    ) -> None:
        self._jobs_dir = jobs_dir
        self._default_timeout_seconds = default_timeout_seconds
        self._max_output_bytes = max_output_bytes
        self._poll_interval = poll_interval

    async def select_target(self, job: JobRequest) -> str:
        """Every job runs here."""
        return TARGET

    async def run(self, target: str, job: JobRequest) -> JobResult:
        """Start the job unless its directory already exists, then wait for its result."""
        self._jobs_dir.mkdir(parents=True, exist_ok=True)
        job_dir = self._jobs_dir.resolve() / _dir_name(job.job_id)
        launcher_status: int | None = None
        try:
            os.mkdir(job_dir)
        except FileExistsError:
            log.info("sandbox_job_reattached", job_id=job.job_id, job_dir=str(job_dir))
            _warn_if_request_differs(job, job_dir)
        else:
            try:
                # Shielded: a caller that stops waiting (an interrupted node) must not kill the
                # launcher before the supervisor has claimed the job; it is re-attached later.
                launcher_status = await asyncio.shield(self._launch(job, job_dir))
            except OSError as exc:
                log.error("sandbox_launch_failed", job_id=job.job_id, error=str(exc))
                launcher_status = -1
        return _with_target(await self._wait(job, job_dir, launcher_status), target)

    async def cancel(self, target: str, job: JobRequest) -> None:
        """Stop the job; see the module docstring. Returns without waiting for it to end."""
        self._jobs_dir.mkdir(parents=True, exist_ok=True)
        job_dir = self._jobs_dir.resolve() / _dir_name(job.job_id)
        try:
            os.mkdir(job_dir)
        except FileExistsError:
            pass
        else:  # never started: the cancelled result is its only result
            _record(job, job_dir, "cancelled", "cancelled before it started")
            return
        supervisor.write_atomic(job_dir / supervisor.CANCEL_FILE, b"", exclusive=True)
        try:
            claim = (job_dir / supervisor.PID_FILE).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return  # the supervisor is starting; it sees the mark before it runs anything
        if claim.isdigit() and _process_alive(int(claim), job_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(claim), signal.SIGTERM)

    async def _launch(self, job: JobRequest, job_dir: Path) -> int:
        """Start the supervisor; return once it has claimed the job (0) or failed to (non-zero)."""
        request = json.dumps(job.to_json()).encode()
        supervisor.write_atomic(job_dir / supervisor.REQUEST_FILE, request)
        timeout = job.sandbox.timeout_seconds or self._default_timeout_seconds
        with (job_dir / supervisor.LOG_FILE).open("ab") as log_file:
            launcher = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                str(_SUPERVISOR_SCRIPT),
                str(job_dir),
                str(timeout),
                str(self._max_output_bytes),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                # Its own session: signals to the engine's process group do not reach the job.
                start_new_session=True,
                cwd=job_dir,
                env={"PATH": supervisor.SAFE_PATH, "LANG": "C.UTF-8"},
            )
        # The launcher forks the real supervisor and exits as soon as it has claimed the job.
        status = await launcher.wait()
        log.info(
            "sandbox_job_started",
            job_id=job.job_id,
            task_id=job.task_id,
            step_id=job.step_id,
            attempt=job.attempt,
            launcher_status=status,
            timeout_seconds=timeout,
        )
        return status

    async def _wait(self, job: JobRequest, job_dir: Path, launcher_status: int | None) -> JobResult:
        """Poll for ``result.json`` until it appears or the job provably cannot produce one."""
        delay = self._poll_interval
        while True:
            result = _read_result(job_dir)
            if result is not None:
                return result
            gone = _why_gone(job_dir, launcher_status)
            if gone is not None:
                return _declare_lost(job, job_dir, gone)
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, _MAX_POLL_INTERVAL)


def _dir_name(job_id: str) -> str:
    """`job_id` itself when it is a safe file name, else a digest of it."""
    if _SAFE_NAME.match(job_id):
        return job_id
    return "job-" + hashlib.sha256(job_id.encode()).hexdigest()


def _warn_if_request_differs(job: JobRequest, job_dir: Path) -> None:
    """Log when a job id comes back with another request: the first one is what runs."""
    try:
        stored = json.loads((job_dir / supervisor.REQUEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # not written yet, or the launcher died first; the wait handles that
    if stored != job.to_json():
        log.warning("sandbox_job_request_differs", job_id=job.job_id, job_dir=str(job_dir))


def _with_target(result: JobResult, target: str) -> JobResult:
    return result.model_copy(update={"target": target})


def _read_result(job_dir: Path) -> JobResult | None:
    try:
        text = (job_dir / supervisor.RESULT_FILE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return JobResult.from_json(json.loads(text))


def _why_gone(job_dir: Path, launcher_status: int | None) -> str | None:
    """Why the job can no longer produce a result, or None while it still may.

    `launcher_status` is the launcher's exit status when this process started the job, None
    when it re-attached to a job some earlier (or other) process started.
    """
    try:
        claim = (job_dir / supervisor.PID_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        claim = None
    if claim is None:
        if launcher_status is not None:
            reason = f"its supervisor did not start (launcher status {launcher_status})"
        elif time.time() - job_dir.stat().st_mtime >= _CLAIM_GRACE_SECONDS:
            reason = f"no supervisor claimed it within {_CLAIM_GRACE_SECONDS:.0f} s"
        else:
            return None
        # Claim the job ourselves, so a supervisor that was merely slow will not run it now.
        lost_claim = supervisor.LOST_MARKER.encode()
        if supervisor.write_atomic(job_dir / supervisor.PID_FILE, lost_claim, exclusive=True):
            return reason
        return None  # a supervisor claimed it just now; keep waiting on it
    if claim == supervisor.LOST_MARKER:
        return "it was declared lost before it started"
    pid = int(claim)
    if _process_alive(pid, job_dir):
        return None
    return f"its supervisor (pid {pid}) is no longer running"


def _process_alive(pid: int, job_dir: Path) -> bool:
    """Whether `pid` is still this job's supervisor (not exited, a zombie, or a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else; /proc below tells whether it is ours
    proc = Path("/proc") / str(pid)
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc to ask: trust kill(0)
    state = stat.rsplit(")", 1)[-1].split()[0]
    if state in ("Z", "X"):
        return False
    return str(job_dir).encode() in cmdline  # else the pid was reused by another process


def _declare_lost(job: JobRequest, job_dir: Path, reason: str) -> JobResult:
    """Record the job as failed without running it; an existing result wins over this one."""
    stderr = (
        f"job {job.job_id} was lost: {reason}; it is not run again for the same job id"
        + _relative_to_work_dir(_log_tail(job_dir), job_dir)
    )
    result = _record(job, job_dir, "failed", stderr)
    if result.status == "failed" and result.stderr == stderr:
        log.warning(
            "sandbox_job_lost",
            job_id=job.job_id,
            task_id=job.task_id,
            reason=reason,
            job_dir=str(job_dir),
        )
    return result


def _record(job: JobRequest, job_dir: Path, status: JobStatus, stderr: str) -> JobResult:
    """Write a result for a job that did not run to its end; an existing result wins."""
    work_dir = job_dir / supervisor.WORK_DIR
    now = supervisor.now_rfc3339()
    result = JobResult(
        task_id=job.task_id,
        job_id=job.job_id,
        status=status,
        exit_code=None,
        stdout="",
        stderr=stderr,
        started_at=now,
        ended_at=now,
        work_dir=str(work_dir.resolve()) if work_dir.is_dir() else None,
        target=TARGET,
    )
    data = json.dumps(result.to_json()).encode()
    if not supervisor.write_atomic(job_dir / supervisor.RESULT_FILE, data, exclusive=True):
        existing = _read_result(job_dir)
        if existing is not None:
            return existing
    return result


def _log_tail(job_dir: Path) -> str:
    try:
        with (job_dir / supervisor.LOG_FILE).open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            start = max(0, handle.tell() - _LOG_TAIL_BYTES)
            handle.seek(start)
            raw = handle.read()
    except FileNotFoundError:
        return ""
    if start > 0:  # whole lines only: a cut path could not be made relative
        raw = raw.partition(b"\n")[2]
    tail = raw.decode("utf-8", errors="replace").strip()
    return f"\nsupervisor log:\n{tail}" if tail else ""


def _relative_to_work_dir(text: str, job_dir: Path) -> str:
    """`text` (the supervisor's own log) with the job's paths relative to its work directory.

    A client reads a lost job's stderr; where the server keeps its jobs is not its business, and
    a path relative to the work dir is what its checks use. The operator's log keeps `job_dir`.
    """
    work_dir = str(job_dir / supervisor.WORK_DIR)
    text = text.replace(work_dir + os.sep, "").replace(work_dir, ".")
    return text.replace(str(job_dir) + os.sep, ".." + os.sep).replace(str(job_dir), "..")
