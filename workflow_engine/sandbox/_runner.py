"""Runs local jobs at about the cost of a fork/exec, once per job id, outliving the engine.

The engine starts each job itself with ``posix_spawn``, in a session of its own (so signals to
the engine's process group do not reach it, and it outlives a killed engine), through a small
wrapper that runs the command and writes its exit status to ``exit_status`` when it ends:
``jobwrap`` (`sandbox._wrapper`; where it was not built, no runner is made). The engine waits
on its own child cheaply (a pidfd on the event loop, no thread, no polling; `sandbox._processes`),
enforces the deadline with a timer on its loop, reaps the child and writes ``result.json``
itself. The files are for the crash path: an engine that finds a
job directory it did not start (its starter was killed, or this is another process) waits on
the pid recorded in ``supervisor.pid`` (a pidfd again, after checking that pid is still this
job's wrapper) and builds the result from the files (`sandbox._files` holds the layout). So the
common path costs a vfork/exec of ``jobwrap`` and a fork/exec of the command (which enters
its namespaces and user in between): 1.8 ms of CPU per ``true`` job here (measure with
``benchmarks/job_cost.py``). In the engine a job costs one ``mkdir``, the spawn, a pidfd, and
reading two small files and writing one; jobwrap makes the work directory.

Exactly once: creating the job directory claims the job id (a second `run` of it, in this
process or a restarted one, re-attaches instead). The wrapper then claims the job for itself
by creating ``supervisor.pid`` exclusively (``O_EXCL``) with its pid, and only
then runs anything. A re-attaching engine that finds no claim after `claim_grace_seconds`
claims it as ``lost`` itself, so a late wrapper never runs it (nothing runs under an engine
that died between creating the directory and spawning).

The deadline: while the engine lives, its timer writes ``timed_out`` and SIGKILLs the job's
process group. Every wrapper also holds the read end of one pipe whose write end only the
engine (this `JobRunner`) holds, and watches it: the pipe reads end of file only once the
engine is gone (killed, or `close`d), and the wrapper then waits out what is left of the
deadline (on CLOCK_BOOTTIME, the clock the deadline was set on) and does the same; for a
cancelled job (``cancel`` exists) it waits `cancel_grace_seconds` instead. So the crash path
still bounds every job, and the common path starts no timer process. The wrapper stops the command's
whole process group when it ends (background children included) and records the exit
status; a job whose wrapper vanished without recording one or a deadline (killed) is reported
lost, never run again. Cancel writes
``cancel`` (a wrapper that sees it runs nothing) and sends SIGTERM to the job's process group:
the command gets it, the wrapper kills what is left once the command has ended, and the
result says ``cancelled``; the cancelling engine sends SIGKILL `cancel_grace_seconds` (and a
second) later should anything still run, and so does the wrapper once the engine that started
the job is gone (a cancel that comes after that is bounded by the deadline only).

Retention: a job's directory is kept `retention_seconds` after its result was recorded (a
directory with no result, `retention_seconds` after it last changed plus the longest a job may
run), then removed by `prune` (`sandbox._retention`), which the runner calls in the background
every quarter of the retention (at most hourly) once `start_pruning` was called. So "once per
job id" holds for the retention: a job id sent again after its directory was removed runs
again. The directory is first renamed to a hidden name (on the event loop's thread, never
while this runner follows the job), so a `run` of its id sees either the whole directory or none.

What a job may use (its user, limits, no network) is `sandbox._grant`'s to say; the wrapper applies
it just before the command. The network namespace (and, not as root, the user namespace) it
runs in is its task's, made at the task's first job (`sandbox._namespaces`) and entered by
``jobwrap``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

from workflow_engine.domain.held import Held
from workflow_engine.domain.jobs import JobRequest, JobResult, rfc3339
from workflow_engine.domain.task import MAX_TIMEOUT_SECONDS
from workflow_engine.sandbox import _files as files
from workflow_engine.sandbox import _processes as processes
from workflow_engine.sandbox import _retention as retention
from workflow_engine.sandbox import _wrapper as job_wrapper
from workflow_engine.sandbox._at_fork import ClosedInChild
from workflow_engine.sandbox._grant import Confinement, Grant
from workflow_engine.sandbox._namespaces import TaskNamespaces

log = structlog.get_logger(__name__)

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:=@+-]{0,127}$")
_MIN_PRUNE_INTERVAL = 0.25
#: The write ends of every runner's pipe in this process: a forked child (which is not the
#: engine) closes them, or the wrappers would take it for their engine.
_engine_pipes: ClosedInChild[int] = ClosedInChild(os.close)


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
        confinement: Confinement | None = None,
        retention_seconds: float = 0,
    ) -> None:
        """`retention_seconds`: how long a finished job's directory is kept (see the module
        docstring); 0 keeps it for good. Raises `CapabilityConfigError` when ``jobwrap`` is not
        built (`sandbox._wrapper.require_jobwrap`): no job could run."""
        if not 0 <= retention_seconds < math.inf:
            raise ValueError(f"retention_seconds: expected 0 or more, got {retention_seconds}")
        self._jobwrap = job_wrapper.require_jobwrap()
        self._jobs_dir = jobs_dir.resolve()
        self._retention_seconds = retention_seconds
        self._pruner: asyncio.Task[None] | None = None
        # The namespaces each task's jobs share (`sandbox._namespaces`).
        self._namespaces = TaskNamespaces(self._jobwrap)
        self._confinement = confinement or Confinement()
        self._confinement.keep_users_in(self._jobs_dir)
        self._jobs_dir_made = False
        self._default_timeout_seconds = default_timeout_seconds
        self._max_output_bytes = max_output_bytes
        self._poll_interval = poll_interval
        self._cancel_grace_seconds = cancel_grace_seconds
        self._claim_grace_seconds = claim_grace_seconds
        # The pipe every wrapper watches (see the module docstring): (read end, write
        # end, the pid that made it), made at the first job so that a process forked before
        # then makes its own.
        self._pipe: tuple[int, int, int] | None = None
        # One watch per job this process follows, by job dir: its result once the job ends.
        self._watches: dict[Path, asyncio.Task[JobResult]] = {}
        self._timers: set[asyncio.TimerHandle] = set()
        self._task_tmp = retention.TaskTmp(self._jobs_dir)

    def held(self) -> list[Held]:
        """Jobs followed (each ends as its job ends) and the caches of tasks' users,
        namespaces and /tmp."""
        return [
            Held("sandbox.watches", len(self._watches)),
            Held("sandbox.timers", len(self._timers)),
            *self._confinement.held(),
            *self._namespaces.held(),
            *self._task_tmp.held(),
        ]

    async def run(self, job: JobRequest) -> JobResult:
        """Start the job unless its directory exists, then wait for its result."""
        job_dir = self._job_dir(job.job_id)
        watch = self._watches.get(job_dir)
        if watch is None:
            try:
                self._mkdir(job_dir)
            except FileExistsError:
                log.info("sandbox_job_reattached", job_id=job.job_id, job_dir=str(job_dir))
                _warn_if_request_differs(job, job_dir)
                watch = self._watch(job_dir, self._follow(job, job_dir))
            else:
                grant = self._confinement.grant(job)
                if isinstance(grant, str):
                    log.warning("sandbox_job_refused", job_id=job.job_id, reason=grant)
                    return files.record_unrun(job, job_dir, "failed", grant)
                watch = self._watch(job_dir, self._start(job, job_dir, grant))
        # Shielded: a caller that stops waiting (an interrupted node) leaves the job running,
        # and its watch still reaps it and records its result.
        return await asyncio.shield(watch)

    async def cancel(self, job: JobRequest) -> None:
        """Stop the job for good; see the module docstring. Returns without waiting for it."""
        job_dir = self._job_dir(job.job_id)
        try:
            self._mkdir(job_dir)
        except FileExistsError:
            pass
        else:  # never started: the cancelled result is its only result
            files.record_unrun(job, job_dir, "cancelled", "cancelled before it started")
            return
        files.write_atomic(job_dir / files.CANCEL_FILE, b"", exclusive=True)
        claim = files.read_claim(job_dir)
        if claim is not None and claim.isdigit():
            pid = int(claim)
            if processes.signal_wrapper(pid, job_dir, signal.SIGTERM):
                delay = self._cancel_grace_seconds + 1.0
                self._later(delay, processes.signal_wrapper, pid, job_dir, signal.SIGKILL)
        if job_dir not in self._watches:  # someone must record the cancelled result
            self._watch(job_dir, self._follow(job, job_dir))

    def recorded_task_id(self, job_id: str) -> str | None:
        """The task `job_id`'s job was first sent for, as its directory records it; None when
        there is no such job, or it does not say yet (`job_files.recorded_task_id`)."""
        return files.recorded_task_id(self._job_dir(job_id))

    def start_pruning(self) -> None:
        """Remove expired job directories from now on, in the background (until `close`)."""
        if self._retention_seconds > 0 and self._pruner is None:
            self._pruner = asyncio.create_task(self._prune_forever(), name="job-dirs-prune")

    async def prune(self) -> int:
        """Remove the job directories whose retention has passed, and free the users of tasks
        none of whose jobs can still run or be kept; how many directories it removed."""
        idle = self._retention_seconds + MAX_TIMEOUT_SECONDS
        await asyncio.to_thread(self._confinement.release_idle_users, idle)
        idle_tmp = await asyncio.to_thread(retention.idle_entries, self._task_tmp.root, idle)
        self._task_tmp.forget()  # what remains is looked at afresh
        await asyncio.to_thread(retention.remove, idle_tmp)
        cutoff = time.time() - self._retention_seconds
        doomed: list[Path] = []
        for path in await asyncio.to_thread(retention.expired, self._jobs_dir, cutoff):
            if path.name.startswith(retention.PRUNED):  # left by an interrupted prune
                doomed.append(path)
            elif path not in self._watches:  # a job followed here is not over for us
                hidden = path.with_name(f"{retention.PRUNED}{path.name}-{os.urandom(4).hex()}")
                with contextlib.suppress(OSError):  # gone meanwhile
                    os.rename(path, hidden)
                    doomed.append(hidden)
        await asyncio.to_thread(retention.remove, doomed)
        if doomed:
            log.info("job_dirs_pruned", count=len(doomed), jobs_dir=str(self._jobs_dir))
        return len(doomed)

    async def _prune_forever(self) -> None:
        interval = max(_MIN_PRUNE_INTERVAL, min(self._retention_seconds / 4, 3600.0))
        while True:
            try:
                await self.prune()
            except OSError as exc:  # e.g. the jobs dir unreadable: said, and tried again later
                log.warning("job_dirs_prune_failed", jobs_dir=str(self._jobs_dir), error=str(exc))
            await asyncio.sleep(interval)

    async def close(self) -> None:
        """Stop following jobs (they run on, to be re-attached by the next engine).

        Their wrappers read end of file now, and keep their deadlines from here on.
        """
        if self._pruner is not None:
            self._pruner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pruner
            self._pruner = None
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        watches = list(self._watches.values())
        for watch in watches:
            watch.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        self._namespaces.close()
        if self._pipe is not None:
            read_end, write_end, _ = self._pipe
            self._pipe = None
            _engine_pipes.discard(write_end)
            os.close(read_end)
            os.close(write_end)

    def _job_dir(self, job_id: str) -> Path:
        return self._jobs_dir / _dir_name(job_id)

    def _mkdir(self, job_dir: Path) -> None:
        """Create `job_dir` (FileExistsError if it exists): the claim on its job id."""
        # Both may be entered (a job's user reaches its work dir), neither listed.
        if not self._jobs_dir_made:
            self._jobs_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
            self._jobs_dir_made = True
        try:
            os.mkdir(job_dir, 0o711)
        except FileNotFoundError:  # the jobs dir was removed under us
            self._jobs_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
            os.mkdir(job_dir, 0o711)

    def _engine_pipe(self) -> int:
        """The read end of this runner's pipe, made in this process."""
        if self._pipe is None or self._pipe[2] != os.getpid():
            read_end, write_end = os.pipe()  # both close-on-exec: no job holds the write end
            _engine_pipes.add(write_end)
            self._pipe = (read_end, write_end, os.getpid())
        return self._pipe[0]

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

    async def _start(self, job: JobRequest, job_dir: Path, grant: Grant) -> JobResult:
        """Run the job whose directory this process just created, and record its result."""
        timeout = job.sandbox.timeout_seconds or self._default_timeout_seconds
        started = time.time()
        try:
            # Shielded: an engine closing meanwhile still starts the job it claimed the
            # directory of (it runs on, to be re-attached), rather than leave it unclaimed.
            pid = await asyncio.shield(
                self._launch(job, job_dir, timeout_seconds=timeout, grant=grant)
            )
        except OSError as exc:
            log.error("sandbox_launch_failed", job_id=job.job_id, error=str(exc))
            return _declare_lost(job, job_dir, f"its wrapper did not start ({exc})")
        log.info(
            "sandbox_job_started",
            job_id=job.job_id,
            task_id=job.task_id,
            step_id=job.step_id,
            attempt=job.attempt,
            pid=pid,
            timeout_seconds=timeout,
            uid=grant.uid,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.call_later(timeout, processes.deadline_passed, pid, job_dir)
        try:
            # Cancelled (the engine closing): the job runs on, its wrapper keeping the deadline.
            await processes.until_exited(
                pid, lambda: processes.exited_child(pid), self._poll_interval
            )
        finally:
            deadline.cancel()
        # What the wrapper left behind, if it was killed before its own `kill -9 0`. Not reaped
        # yet, it holds its group id, so this cannot hit a reused one.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        processes.reap(pid)
        return self._finish(job, job_dir, pid, started, timeout)

    async def _launch(
        self, job: JobRequest, job_dir: Path, *, timeout_seconds: int, grant: Grant
    ) -> int:
        """`_spawn` the job's wrapper into its task's namespaces, made at its first job."""
        shared: tuple[int, ...] = ()
        if grant.isolation in ("net", "userns"):
            shared = await self._namespaces.for_task(job.workspace, grant.isolation)
        return self._spawn(job, job_dir, timeout_seconds, grant, shared)

    def _spawn(
        self, job: JobRequest, job_dir: Path, timeout: int, grant: Grant, shared: tuple[int, ...]
    ) -> int:
        """Start the job's wrapper, which claims the job unless it was declared lost first.

        `shared`: the task's namespaces (`sandbox._namespaces`) for jobwrap to enter, else ()."""
        return job_wrapper.spawn_jobwrap(
            self._jobwrap,
            job,
            job_dir,
            grant,
            deadline=math.ceil(time.clock_gettime(time.CLOCK_BOOTTIME) + timeout),
            grace=self._cancel_grace_seconds,
            engine_pipe=self._engine_pipe(),
            shared=shared,
            task_tmp=self._task_tmp.path(job.workspace, grant.uid),
        )

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
            if claim:
                break
            # No claim, or one being written (the wrapper creates it, then writes its pid).
            claimed_at = job_dir / files.PID_FILE if claim == "" else job_dir
            if time.time() - files.modified_at(claimed_at) >= self._claim_grace_seconds:
                reason = f"no wrapper claimed it within {self._claim_grace_seconds:.0f} s"
                if claim == "":  # its wrapper died writing the claim, so it ran nothing
                    return _declare_lost(job, job_dir, reason)
                # Claim it ourselves, so that a wrapper that was merely slow never runs it.
                lost = files.LOST_MARKER.encode()
                if files.write_atomic(job_dir / files.PID_FILE, lost, exclusive=True):
                    return _declare_lost(job, job_dir, reason)
                continue
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, processes.MAX_POLL_INTERVAL)
        if not claim.isdigit():
            return _declare_lost(job, job_dir, f"its claim {claim[:40]!r} names no process")
        pid = int(claim)
        started = files.modified_at(job_dir / files.PID_FILE)
        await processes.until_exited(
            pid, lambda: None if processes.is_wrapper(pid, job_dir) else 0, delay
        )
        timeout = job.sandbox.timeout_seconds or self._default_timeout_seconds
        return self._finish(job, job_dir, pid, started, timeout)

    def _finish(
        self, job: JobRequest, job_dir: Path, pid: int, started: float, timeout: int
    ) -> JobResult:
        """Record the result of a job whose wrapper has ended (an existing result wins)."""
        status = files.read_exit_status(job_dir)
        exit_status, ended = status if status is not None else (None, time.time())
        cancelled = (job_dir / files.CANCEL_FILE).exists()
        timed_out = None
        if exit_status is None or exit_status in files.TIMEOUT_EXIT_STATUSES:
            timed_out = files.timed_out_at(job_dir)
            if timed_out is not None and exit_status is None:
                ended = timed_out
        # A file's mtime comes from a coarse clock, a few ms behind `time.time()`.
        ended = max(ended, started)
        ended_as = files.outcome(
            exit_status,
            cancelled=cancelled,
            started=cancelled and (job_dir / files.STDOUT_FILE).exists(),
            timed_out=timed_out is not None,
            elapsed=ended - started,
            timeout=timeout,
        )
        if ended_as is None:
            reason = f"its wrapper (pid {pid}) ended without recording the command's exit status"
            return _declare_lost(job, job_dir, reason)
        if ended_as[0] == "failed" and exit_status is not None:
            grant = self._confinement.grant(job)
            if isinstance(grant, Grant):
                stderr = files.read_head(job_dir / files.STDERR_FILE, self._max_output_bytes)[0]
                ended_as = (ended_as[0], ended_as[1], grant.explain(exit_status, stderr))
        result = files.build_result(
            job,
            job_dir,
            ended_as,
            started_at=rfc3339(started),
            ended_at=rfc3339(ended),
            max_output_bytes=self._max_output_bytes,
        )
        return files.record(job_dir, result)


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
