"""Runs local jobs at about the cost of a fork/exec, once per job id, outliving the engine.

The engine starts each job itself, in a session of its own (so signals to the engine's
process group do not reach it, and it outlives a killed engine), through a small ``/bin/sh``
wrapper (`WRAPPER`) that runs the command under coreutils ``timeout`` and writes its exit
status to ``exit_status`` when it ends. The engine waits on its own child cheaply (a pidfd on
the event loop, no thread, no polling), reaps it and writes ``result.json`` itself. The files
are for the crash path: an engine that finds a job directory it did not start (its starter was
killed, or this is another process) waits on the pid recorded in ``supervisor.pid`` (a pidfd
again, after checking that pid is still this job's wrapper) and builds the result from the
files (`job_files` holds the layout). So the common path costs a vfork/exec of ``sh``, which
forks ``timeout``, which execs the command: about 3 ms of CPU here against some 60 ms for the
Python supervisor this replaces, and nothing per job in the engine but a few small files.

Exactly once: creating the job directory claims the job id (a second `run` of it, in this
process or a restarted one, re-attaches instead). The wrapper then waits on its stdin until the
engine has recorded its pid in ``supervisor.pid`` (created exclusively, like the directory);
only then does it run anything. An engine killed in between leaves a wrapper that reads end of
file and exits without running; a re-attaching engine that finds no claim after
`claim_grace_seconds` claims it as ``lost`` itself, so a late wrapper never runs it either.

What the wrapper does without the engine: enforce the deadline (``timeout -s KILL``), stop the
command's whole process group when it ends (background children included), and record the exit
status. A job whose wrapper vanished without recording one (killed) is reported lost, never run
again. Cancel writes ``cancel`` (a wrapper that sees it runs nothing) and sends SIGTERM to the
job's process group: ``timeout`` passes it to the command and kills it `cancel_grace_seconds`
later if it is still there, the wrapper's trap then kills what is left, and the result says
``cancelled``; the engine sends SIGKILL a second after that should anything still run.

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
import shutil
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from workflow_engine.capabilities import job_files as files
from workflow_engine.domain.jobs import JobRequest, JobResult, rfc3339

log = structlog.get_logger(__name__)

#: The wrapper: ``sh -c WRAPPER JOB_DIR TIMEOUT_BIN SECONDS GRACE COMMAND...`` in the job dir.
#: ``$0`` is the job dir so that a re-attaching engine can tell the wrapper's pid from a reused
#: one (/proc/PID/cmdline). Its trap stops the job's group on a cancel, but only once the
#: command has ended (``timeout`` forwards the SIGTERM, and SIGKILLs after the grace period).
WRAPPER = """trap 'kill -9 0' TERM
read -r go && [ "$go" = run ] || exit 97
exec </dev/null
[ ! -e cancel ] || exit 98
cd work || exit 96
t=$1 seconds=$2 grace=$3
shift 3
"$t" --foreground -k "$grace" -s KILL "$seconds" "$@" >../stdout.log 2>../stderr.log
echo "$?" >../exit_status
kill -9 0
"""
_SHELL = "/bin/sh"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:=@+-]{0,127}$")
_MAX_POLL_INTERVAL = 0.5


class JobRunner:
    """The local jobs of one jobs directory; the local sandbox and a worker node share it."""

    def __init__(
        self,
        *,
        jobs_dir: Path,
        default_timeout_seconds: int = 3600,
        max_output_bytes: int = 64 * 1024,
        poll_interval: float = 0.05,
        cancel_grace_seconds: float = 2.0,
        claim_grace_seconds: float = 10.0,
    ) -> None:
        self._jobs_dir = jobs_dir
        self._default_timeout_seconds = default_timeout_seconds
        self._max_output_bytes = max_output_bytes
        self._poll_interval = poll_interval
        self._cancel_grace_seconds = cancel_grace_seconds
        self._claim_grace_seconds = claim_grace_seconds
        self._timeout_bin = shutil.which("timeout", path=files.SAFE_PATH)
        # One watch per job this process follows, by job dir: its result once the job ends.
        self._watches: dict[Path, asyncio.Task[JobResult]] = {}
        self._timers: set[asyncio.TimerHandle] = set()

    async def run(self, job: JobRequest) -> JobResult:
        """Start the job unless its directory exists, then wait for its result."""
        job_dir = self._job_dir(job.job_id)
        watch = self._watches.get(job_dir)
        if watch is None:
            try:
                os.mkdir(job_dir)
            except FileExistsError:
                log.info("sandbox_job_reattached", job_id=job.job_id, job_dir=str(job_dir))
                _warn_if_request_differs(job, job_dir)
                watch = self._watch(job_dir, self._follow(job, job_dir))
            else:
                watch = self._watch(job_dir, self._start(job, job_dir))
        # Shielded: a caller that stops waiting (an interrupted node) leaves the job running,
        # and its watch still reaps it and records its result.
        return await asyncio.shield(watch)

    async def cancel(self, job: JobRequest) -> None:
        """Stop the job for good; see the module docstring. Returns without waiting for it."""
        job_dir = self._job_dir(job.job_id)
        try:
            os.mkdir(job_dir)
        except FileExistsError:
            pass
        else:  # never started: the cancelled result is its only result
            files.record_unrun(job, job_dir, "cancelled", "cancelled before it started")
            return
        files.write_atomic(job_dir / files.CANCEL_FILE, b"", exclusive=True)
        claim = files.read_claim(job_dir)
        if claim is not None and claim.isdigit():
            pid = int(claim)
            if _signal_wrapper(pid, job_dir, signal.SIGTERM):
                delay = self._cancel_grace_seconds + 1.0
                self._later(delay, _signal_wrapper, pid, job_dir, signal.SIGKILL)
        if job_dir not in self._watches:  # someone must record the cancelled result
            self._watch(job_dir, self._follow(job, job_dir))

    async def close(self) -> None:
        """Stop following jobs (they run on, to be re-attached by the next engine)."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        watches = list(self._watches.values())
        for watch in watches:
            watch.cancel()
        await asyncio.gather(*watches, return_exceptions=True)

    def _job_dir(self, job_id: str) -> Path:
        self._jobs_dir.mkdir(parents=True, exist_ok=True)
        return self._jobs_dir.resolve() / _dir_name(job_id)

    def _watch(self, job_dir: Path, follow: Awaitable[JobResult]) -> asyncio.Task[JobResult]:
        task = asyncio.ensure_future(follow)
        self._watches[job_dir] = task
        task.add_done_callback(lambda _: self._watches.pop(job_dir, None))
        return task

    def _later(self, delay: float, callback: Callable[..., object], *args: object) -> None:
        def fire() -> None:
            self._timers.discard(timer)
            callback(*args)

        timer = asyncio.get_running_loop().call_later(delay, fire)
        self._timers.add(timer)

    async def _start(self, job: JobRequest, job_dir: Path) -> JobResult:
        """Run the job whose directory this process just created, and record its result."""
        timeout = job.sandbox.timeout_seconds or self._default_timeout_seconds
        started = time.time()
        try:
            wrapper = self._spawn(job, job_dir, timeout)
        except OSError as exc:
            log.error("sandbox_launch_failed", job_id=job.job_id, error=str(exc))
            return _declare_lost(job, job_dir, f"its wrapper did not start ({exc})")
        if wrapper is None:  # declared lost before we could claim it: nothing ran
            return await self._follow(job, job_dir)
        log.info(
            "sandbox_job_started",
            job_id=job.job_id,
            task_id=job.task_id,
            step_id=job.step_id,
            attempt=job.attempt,
            pid=wrapper.pid,
            timeout_seconds=timeout,
        )
        # Cancelled (the engine closing): the job runs on, and `subprocess` reaps it later.
        await _until_exited(wrapper.pid, lambda: _exited_child(wrapper.pid), self._poll_interval)
        # What the wrapper left behind, if it was killed before its own `kill -9 0`. Not reaped
        # yet, it holds its group id, so this cannot hit a reused one.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(wrapper.pid, signal.SIGKILL)
        wrapper.wait()
        return self._finish(job, job_dir, wrapper.pid, started, timeout)

    def _spawn(
        self, job: JobRequest, job_dir: Path, timeout: int
    ) -> subprocess.Popen[bytes] | None:
        """Start the wrapper and claim the job for it; None if the claim was taken first."""
        if self._timeout_bin is None:
            raise OSError(f"coreutils `timeout` is not on {files.SAFE_PATH}")
        request = job.to_json()
        files.write_atomic(job_dir / files.REQUEST_FILE, json.dumps(request).encode())
        work_dir = job_dir / files.WORK_DIR
        work_dir.mkdir()
        go_read, go_write = os.pipe()
        try:
            with open(job_dir / files.LOG_FILE, "ab") as log_file:
                wrapper = subprocess.Popen(
                    [
                        _SHELL,
                        "-c",
                        WRAPPER,
                        str(job_dir),
                        self._timeout_bin,
                        str(timeout),
                        str(self._cancel_grace_seconds),
                        *job.sandbox.command,
                    ],
                    stdin=go_read,
                    stdout=log_file,
                    stderr=log_file,
                    cwd=job_dir,
                    env=files.job_env(request, work_dir),
                    # Its own session: signals to the engine's process group do not reach it.
                    start_new_session=True,
                )
        except BaseException:
            os.close(go_write)
            raise
        finally:
            os.close(go_read)
        with os.fdopen(go_write, "wb", buffering=0) as go:
            claimed = files.write_atomic(
                job_dir / files.PID_FILE, str(wrapper.pid).encode(), exclusive=True
            )
            with contextlib.suppress(BrokenPipeError):
                go.write(b"run\n" if claimed else b"no\n")
        if not claimed:
            wrapper.wait()
            return None
        return wrapper

    async def _follow(self, job: JobRequest, job_dir: Path) -> JobResult:
        """Wait for a job some other process (or an earlier engine) started, and its result."""
        delay = self._poll_interval
        while True:
            result = files.read_result(job_dir)
            if result is not None:
                return result
            claim = files.read_claim(job_dir)
            if claim == files.LOST_MARKER:
                return _declare_lost(job, job_dir, "it was declared lost before it started")
            if claim is not None:
                break
            if time.time() - files.modified_at(job_dir) >= self._claim_grace_seconds:
                # Claim it ourselves, so that a wrapper that was merely slow never runs it.
                reason = f"no wrapper claimed it within {self._claim_grace_seconds:.0f} s"
                lost = files.LOST_MARKER.encode()
                if files.write_atomic(job_dir / files.PID_FILE, lost, exclusive=True):
                    return _declare_lost(job, job_dir, reason)
                continue
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, _MAX_POLL_INTERVAL)
        if not claim.isdigit():
            return _declare_lost(job, job_dir, f"its claim {claim[:40]!r} names no process")
        pid = int(claim)
        started = files.modified_at(job_dir / files.PID_FILE)
        await _until_exited(pid, lambda: None if _is_wrapper(pid, job_dir) else 0, delay)
        timeout = job.sandbox.timeout_seconds or self._default_timeout_seconds
        return self._finish(job, job_dir, pid, started, timeout)

    def _finish(
        self, job: JobRequest, job_dir: Path, pid: int, started: float, timeout: int
    ) -> JobResult:
        """Record the result of a job whose wrapper has ended (an existing result wins)."""
        existing = files.read_result(job_dir)
        if existing is not None:
            return existing
        status = files.read_exit_status(job_dir)
        exit_status, ended = status if status is not None else (None, time.time())
        ended_as = files.outcome(
            exit_status,
            cancelled=(job_dir / files.CANCEL_FILE).exists(),
            started=(job_dir / files.STDOUT_FILE).exists(),
            elapsed=ended - started,
            timeout=timeout,
        )
        if ended_as is None:
            reason = f"its wrapper (pid {pid}) ended without recording the command's exit status"
            return _declare_lost(job, job_dir, reason)
        result = files.build_result(
            job,
            job_dir,
            ended_as,
            started_at=rfc3339(started),
            ended_at=rfc3339(ended),
            max_output_bytes=self._max_output_bytes,
        )
        return files.record(job_dir, result)


async def _until_exited(pid: int, poll: Callable[[], int | None], interval: float) -> None:
    """Return once process `pid` has exited: on its pidfd when the kernel has them.

    `poll` says without blocking whether it has (None: still running); it is asked first, so
    a pid that exited (and was perhaps reused) before the pidfd was opened is not waited on.
    """
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfds (old kernel, other OS): poll instead
        while poll() is None:
            await asyncio.sleep(interval)
            interval = min(interval * 1.5, _MAX_POLL_INTERVAL)
        return
    loop = asyncio.get_running_loop()
    exited = loop.create_future()

    def readable() -> None:
        if not exited.done():
            exited.set_result(None)

    try:
        if poll() is not None:
            return
        loop.add_reader(pidfd, readable)
        try:
            await exited
        finally:
            loop.remove_reader(pidfd)
    finally:
        os.close(pidfd)


def _exited_child(pid: int) -> int | None:
    """0 once our child `pid` has exited, None while it runs; it is left for `wait` to reap."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return 0  # reaped already
    return None if info is None else 0


def _is_wrapper(pid: int, job_dir: Path) -> bool:
    """Whether `pid` is still this job's wrapper (not exited, a zombie, or a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:
        return True  # no /proc to ask: trust that it exists
    if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
        return False
    return str(job_dir).encode() in cmdline  # else the pid was reused by another process


def _signal_wrapper(pid: int, job_dir: Path, signum: int) -> bool:
    """Send `signum` to the job's process group while its wrapper runs; whether it did.

    A running wrapper holds its group id, so the group cannot be a reused one.
    """
    if not _is_wrapper(pid, job_dir):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)
        return True
    return False


def _dir_name(job_id: str) -> str:
    """`job_id` itself when it is a safe file name, else a digest of it."""
    if _SAFE_NAME.match(job_id):
        return job_id
    return "job-" + hashlib.sha256(job_id.encode()).hexdigest()


def _warn_if_request_differs(job: JobRequest, job_dir: Path) -> None:
    """Log when a job id comes back with another request: the first one is what runs."""
    try:
        stored = json.loads((job_dir / files.REQUEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # not written yet, or its starter died first; the wait handles that
    if stored != job.to_json():
        log.warning("sandbox_job_request_differs", job_id=job.job_id, job_dir=str(job_dir))


def _declare_lost(job: JobRequest, job_dir: Path, reason: str) -> JobResult:
    """Record the job as failed without running it; an existing result wins over this one."""
    stderr = files.lost_stderr(job, job_dir, reason)
    result = files.record_unrun(job, job_dir, "failed", stderr)
    if result.status == "failed" and result.stderr == stderr:
        log.warning(
            "sandbox_job_lost",
            job_id=job.job_id,
            task_id=job.task_id,
            reason=reason,
            job_dir=str(job_dir),
        )
    return result
