"""A local job's directory: its layout, and the job's result as read back from it.

Whoever creates ``<jobs_dir>/<job_id>/`` owns the job (`sandbox._runner` explains who runs it and
how). The directory holds:

- ``request.json``: the Worker API request, as first sent (a later one with the same id runs
  nothing; the engine compares it only to log a warning, a worker node refuses one of another
  task). The wrapper writes it, once it has claimed the job and before it runs anything; the
  engine keeps its own copy in memory.
- ``supervisor.pid``: the claim, created exclusively: the pid of the job's wrapper
  (``jobwrap``, see `sandbox._wrapper`, which creates it itself), or ``lost`` when the
  job was declared lost before any wrapper claimed it. Whoever creates it decides whether the
  job runs. Empty for the moment between the wrapper creating it and writing its pid.
- ``supervisor.log``: what the wrapper itself said (``jobwrap`` makes it only when it cannot
  go on, so a job that goes well has none; the shell wrapper of earlier versions wrote its
  stdout and stderr there); quoted when the job is lost.
- ``work/``: the command's working directory, ``HOME`` and ``TMPDIR``, owned by the job's user
  (made by ``jobwrap``).
- ``stdout.log``, ``stderr.log``: the command's output (``stdout.log`` exists once it started).
- ``exit_status``: the command's exit status and a newline, written by the wrapper when the
  command ends; what a restarted engine reads when the engine that started the job is gone.
- ``timed_out``: written just before the job's process group is killed at its deadline (by the
  engine, or by the wrapper when no engine is there); the job timed out.
- ``cancel``: present once the job's workflow was cancelled; a wrapper that sees it runs
  nothing.
- ``result.json``: the Worker API result; its presence means the job is over, and the first
  one written is the job's result for good.

The file names are those of the earlier, Python supervisor, so a job it started is re-attached
the same way (its ``result.json`` is read once its supervisor ends).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import signal
from pathlib import Path
from typing import Any

from workflow_engine.domain.jobs import JobRequest, JobResult, JobStatus, TruncatedStreams

REQUEST_FILE = "request.json"
PID_FILE = "supervisor.pid"
LOG_FILE = "supervisor.log"
WORK_DIR = "work"
STDOUT_FILE = "stdout.log"
STDERR_FILE = "stderr.log"
EXIT_STATUS_FILE = "exit_status"
CANCEL_FILE = "cancel"
TIMED_OUT_FILE = "timed_out"
RESULT_FILE = "result.json"
LOST_MARKER = "lost"  # in PID_FILE instead of a pid: the job was declared lost before it ran
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
TARGET = "local"
#: Exit statuses of a command killed at its deadline: SIGKILL (137), or coreutils `timeout`'s
#: own (124), which the wrapper of earlier versions ran.
TIMEOUT_EXIT_STATUSES = (124, 128 + signal.SIGKILL)
#: How a note of the worker's own begins, on a line of a job's stderr.
WORKER_NOTE = "[workflow-engine] "
_LOG_TAIL_BYTES = 2048
_temp_names = itertools.count()


def write_atomic(path: Path, data: bytes, *, exclusive: bool = False) -> bool:
    """Write `data` to `path` so that readers see all of it or nothing.

    With `exclusive`, `path` is only created if it does not exist yet (by `os.link`, which is
    atomic) and False is returned when it already did; otherwise an existing file is replaced.
    Not fsynced: every file here serves a job on this host, and a host that crashes loses the
    job anyway (a torn file reads as absent, and the job as lost); what must outlive the host,
    the result, is in the engine's checkpoint.
    """
    tmp = path.parent / f".tmp-{os.getpid()}-{next(_temp_names)}"
    # Readable by its writer only: a job's user must not read another job's files.
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
        handle.write(data)
    try:
        if not exclusive:
            os.replace(tmp, path)
            return True
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def job_env(request: dict[str, Any], work_dir: Path) -> dict[str, str]:
    """The job's whole environment: a fixed base, the step's env, then the engine's variables.

    Nothing comes from the engine's own environment, which holds secrets such as the database
    URL.
    """
    sandbox = request["sandbox"]
    env = {"PATH": SAFE_PATH, "HOME": str(work_dir), "TMPDIR": str(work_dir), "LANG": "C.UTF-8"}
    env["PWD"] = str(work_dir)  # where it runs, as a shell would say
    env.update({str(k): str(v) for k, v in dict(sandbox.get("env") or {}).items()})
    env["WORKFLOW_ENGINE_TASK_ID"] = str(request["task_id"])
    env["WORKFLOW_ENGINE_JOB_ID"] = str(request["job_id"])
    env["WORKFLOW_ENGINE_ATTEMPT"] = str(request.get("attempt") or 1)
    env["WORKFLOW_ENGINE_REMEDIATION"] = json.dumps(list(request.get("remediation") or ()))
    env["WORKFLOW_ENGINE_CONTEXT"] = json.dumps(list(request.get("context") or ()))
    return env


def job_data(request: dict[str, Any], env: dict[str, str]) -> int:
    """A memfd holding what ``jobwrap`` reads on fd 6: the request's JSON, a NUL, then the
    command's environment as ``NAME=VALUE`` entries each ended by a NUL (the caller closes it).

    A name or value that would split an entry (a NUL; an ``=`` or nothing in a name) is
    refused: it could only smuggle in another variable.
    """
    entries = []
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise ValueError(f"env: {name[:64]!r} cannot be passed to a command")
        entries.append(f"{name}={value}\0")
    data = (json.dumps(request) + "\0" + "".join(entries)).encode("utf-8", "surrogateescape")
    made = os.memfd_create("job", os.MFD_CLOEXEC)
    try:
        # Clear of the descriptors the wrapper gets things on (3 to 6), which spawning it
        # overwrites in order.
        fd = fcntl.fcntl(made, fcntl.F_DUPFD_CLOEXEC, 10)
    finally:
        os.close(made)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_claim(job_dir: Path) -> str | None:
    """The claim in ``supervisor.pid`` (a pid or `LOST_MARKER`), None when there is none."""
    try:
        return (job_dir / PID_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None


def modified_at(path: Path) -> float:
    """When `path` last changed (epoch seconds): a claim's is when its job started."""
    return path.stat().st_mtime


def read_result(job_dir: Path) -> JobResult | None:
    """The recorded result, or None; a torn file (a host crash) counts as none."""
    try:
        text = (job_dir / RESULT_FILE).read_text(encoding="utf-8")
        return JobResult.from_json(json.loads(text))
    except FileNotFoundError:
        return None
    except ValueError:
        return None


def recorded_task_id(job_dir: Path) -> str | None:
    """The task the job in `job_dir` was first sent for: its ``request.json``'s, else its
    ``result.json``'s (a job cancelled before it started has only that); None when neither
    says (no such job, or its wrapper has not written the request yet)."""
    for name in (REQUEST_FILE, RESULT_FILE):
        try:
            recorded = json.loads((job_dir / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # absent, or torn by a crash: the other file may say
        task_id = recorded.get("task_id") if isinstance(recorded, dict) else None
        if isinstance(task_id, str) and task_id:
            return task_id
    return None


def read_exit_status(job_dir: Path) -> tuple[int, float] | None:
    """The command's exit status as the wrapper wrote it and when, None if it did not (yet)."""
    try:
        fd = os.open(job_dir / EXIT_STATUS_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        ended = os.fstat(fd).st_mtime
        raw = os.read(fd, 32)
    finally:
        os.close(fd)
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    if not text.endswith("\n") or not text.strip().isdigit():
        return None  # being written; the newline comes in the same write as the digits
    return int(text), ended


def mark_timed_out(job_dir: Path) -> None:
    """Say that the job is being killed at its deadline (see `TIMED_OUT_FILE`)."""
    with contextlib.suppress(FileNotFoundError):
        os.close(os.open(job_dir / TIMED_OUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def timed_out_at(job_dir: Path) -> float | None:
    """When the job was killed at its deadline, None if it was not."""
    try:
        return (job_dir / TIMED_OUT_FILE).stat().st_mtime
    except FileNotFoundError:
        return None


#: The end is the exit-status file's mtime, which the kernel stamps from a coarse clock (a few
#: ms behind the one `started` is read from): a deadline kill can look that much early.
_CLOCK_SLACK_SECONDS = 0.1


def outcome(
    exit_status: int | None,
    *,
    cancelled: bool,
    started: bool,
    timed_out: bool,
    elapsed: float,
    timeout: int,
) -> tuple[JobStatus, int | None, str] | None:
    """How a job whose wrapper ended came out: status, exit code and a note; None if lost.

    A cancelled job is `cancelled` whatever its command did. A deadline kill (`timed_out`) took
    the wrapper too, so it left no exit status (or, rarely, the command's 137); a job of an
    earlier version's wrapper is told from the command's own 124 or 137 by the time it took.
    """
    if cancelled:
        note = (
            "cancelled: its process group was stopped" if started else "cancelled before it started"
        )
        return "cancelled", None, note
    killed = exit_status is None or exit_status in TIMEOUT_EXIT_STATUSES
    if exit_status is None and not timed_out:
        return None
    if killed and (timed_out or (timeout > 0 and elapsed >= timeout - _CLOCK_SLACK_SECONDS)):
        return "timeout", None, f"timed out after {timeout} s; its process group was killed"
    return ("completed" if exit_status == 0 else "failed"), exit_status, ""


def build_result(
    job: JobRequest,
    job_dir: Path,
    ended: tuple[JobStatus, int | None, str],
    *,
    started_at: str,
    ended_at: str,
    max_output_bytes: int,
) -> JobResult:
    """The result of a job that ran (or was stopped), from its output files."""
    status, exit_code, note = ended
    stdout, stdout_truncated = read_head(job_dir / STDOUT_FILE, max_output_bytes)
    stderr, stderr_truncated = read_head(job_dir / STDERR_FILE, max_output_bytes)
    if note:
        stderr = f"{stderr}\n{WORKER_NOTE}{note}" if stderr else f"{WORKER_NOTE}{note}"
    return JobResult(
        task_id=job.task_id,
        job_id=job.job_id,
        status=status,
        exit_code=exit_code,
        stdout=stdout,
        stderr=stderr,
        started_at=started_at,
        ended_at=ended_at,
        truncated=TruncatedStreams(stdout=stdout_truncated, stderr=stderr_truncated),
        work_dir=str(job_dir / WORK_DIR),
        target=TARGET,
    )


def record(job_dir: Path, result: JobResult) -> JobResult:
    """Make `result` the job's result unless it already has one; return the one that counts."""
    if write_atomic(job_dir / RESULT_FILE, json.dumps(result.to_json()).encode(), exclusive=True):
        return result
    return read_result(job_dir) or result


def record_unrun(job: JobRequest, job_dir: Path, status: JobStatus, stderr: str) -> JobResult:
    """Record a result for a job that did not run to its end; an existing result wins."""
    work_dir = job_dir / WORK_DIR
    result = JobResult.unrun(
        job,
        status,
        stderr,
        target=TARGET,
        work_dir=str(work_dir) if work_dir.is_dir() else None,
    )
    return record(job_dir, result)


def lost_stderr(job: JobRequest, job_dir: Path, reason: str) -> str:
    """What a lost job's result says: why, and the tail of the wrapper's own log."""
    return (
        f"job {job.job_id} was lost: {reason}; it is not run again for the same job id"
        + _relative_to_work_dir(_log_tail(job_dir), job_dir)
    )


def read_head(path: Path, limit: int) -> tuple[str, bool]:
    """The first `limit` bytes of `path` as text, and whether there was more."""
    try:
        with path.open("rb") as handle:
            head = handle.read(limit)
            truncated = bool(handle.read(1))
    except FileNotFoundError:
        return "", False
    return head.decode("utf-8", errors="replace"), truncated


def _log_tail(job_dir: Path) -> str:
    try:
        with (job_dir / LOG_FILE).open("rb") as handle:
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
    """`text` (the wrapper's own log) with the job's paths relative to its work directory.

    A client reads a lost job's stderr; where the server keeps its jobs is not its business, and
    a path relative to the work dir is what its checks use. The operator's log keeps `job_dir`.
    """
    work_dir = str(job_dir / WORK_DIR)
    text = text.replace(work_dir + os.sep, "").replace(work_dir, ".")
    return text.replace(str(job_dir) + os.sep, ".." + os.sep).replace(str(job_dir), "..")
