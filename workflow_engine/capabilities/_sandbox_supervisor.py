"""Runs one sandbox job to completion and records its result, outliving the engine that started it.

Usage: ``python -I _sandbox_supervisor.py JOBDIR TIMEOUT_SECONDS MAX_OUTPUT_BYTES``.

The engine starts this file in its own session; it forks the real supervisor, which is then
nobody's child but init's, so a killed engine does not take the job with it, and a restarted
engine re-attaches by waiting for ``result.json``. It is run by path with ``-I``, so it imports
only the standard library. `sandbox.py` imports the layout constants and helpers below so both
sides agree on the job directory.

Job directory layout: ``request.json`` (the Worker API request), ``supervisor.pid`` (claimed
exclusively: whoever creates it owns the job), ``work/`` (the command's cwd, HOME and TMPDIR),
``stdout.log``/``stderr.log`` (the command's output), ``result.json`` (the Worker API result,
written atomically; its presence means the job is over), ``cancel`` (present once the job's
workflow was cancelled: a supervisor that sees it runs nothing, and SIGTERM tells a running one
to look).

Cancel: on SIGTERM the supervisor sends SIGTERM to the command's process group, SIGKILL after
`CANCEL_GRACE_SECONDS` if anything of it is left, and records the result as ``cancelled``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REQUEST_FILE = "request.json"
PID_FILE = "supervisor.pid"
RESULT_FILE = "result.json"
LOG_FILE = "supervisor.log"
STDOUT_FILE = "stdout.log"
STDERR_FILE = "stderr.log"
WORK_DIR = "work"
CANCEL_FILE = "cancel"
CANCEL_GRACE_SECONDS = 2.0
LOST_MARKER = "lost"  # in PID_FILE instead of a pid: the job was declared lost before it ran
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_NOTE = "[workflow-engine] "


def now_rfc3339() -> str:
    """The current UTC time as RFC 3339 with milliseconds, e.g. ``2024-05-01T12:00:00.000Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def write_atomic(path: Path, data: bytes, *, exclusive: bool = False) -> bool:
    """Write `data` to `path` so readers see all of it or nothing; durable once this returns.

    With `exclusive`, the file is only created if `path` does not exist yet (via `os.link`, which
    is atomic) and False is returned when it already did; otherwise an existing file is replaced.
    """
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
        else:
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return True


def job_env(request: dict[str, Any], work_dir: Path) -> dict[str, str]:
    """The job's whole environment: a fixed base, the step's env, then the engine's variables.

    Nothing comes from the supervisor's (or the engine's) own environment, which holds secrets
    such as the database URL.
    """
    sandbox = request["sandbox"]
    env = {"PATH": SAFE_PATH, "HOME": str(work_dir), "TMPDIR": str(work_dir), "LANG": "C.UTF-8"}
    env.update({str(k): str(v) for k, v in dict(sandbox.get("env") or {}).items()})
    env["WORKFLOW_ENGINE_TASK_ID"] = str(request["task_id"])
    env["WORKFLOW_ENGINE_JOB_ID"] = str(request["job_id"])
    env["WORKFLOW_ENGINE_ATTEMPT"] = str(request.get("attempt") or 1)
    env["WORKFLOW_ENGINE_REMEDIATION"] = json.dumps(list(request.get("remediation") or ()))
    env["WORKFLOW_ENGINE_CONTEXT"] = json.dumps(list(request.get("context") or ()))
    return env


def _read_head(path: Path, limit: int) -> tuple[str, bool]:
    """The first `limit` bytes of `path` as text, and whether there was more."""
    try:
        with path.open("rb") as handle:
            head = handle.read(limit)
            truncated = bool(handle.read(1))
    except FileNotFoundError:
        return "", False
    return head.decode("utf-8", errors="replace"), truncated


class _Cancel:
    """Set by SIGTERM: the job's workflow was cancelled. Holds the running command's pid."""

    requested = False
    pid: int | None = None

    @classmethod
    def on_sigterm(cls, signum: int, frame: object) -> None:
        cls.requested = True
        if cls.pid is not None:
            _signal_group(cls.pid, signal.SIGTERM)


def _run(
    argv: list[str], work_dir: Path, env: dict[str, str], job_dir: Path, timeout: int
) -> tuple[str, int | None, str]:
    """Run `argv` (never via a shell) in its own process group; return status, exit code, note."""
    with (job_dir / STDOUT_FILE).open("wb") as out, (job_dir / STDERR_FILE).open("wb") as err:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=work_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            return "failed", 127, f"cannot run {argv[0]!r}: {exc.strerror or exc}"
        except OSError as exc:  # permission denied, exec format error, ...
            return "failed", 126, f"cannot run {argv[0]!r}: {exc.strerror or exc}"
        _Cancel.pid = proc.pid
        code, ended = _wait(proc, timeout)
        # Background processes the command left behind end with the job.
        _signal_group(proc.pid, signal.SIGKILL)
    if ended == "timeout":
        return "timeout", None, f"timed out after {timeout} s; its process group was killed"
    if ended == "cancelled":
        return "cancelled", None, "cancelled: its process group was stopped"
    assert code is not None
    if code < 0:
        signum = -code
        name = signal.Signals(signum).name if signum in signal.valid_signals() else str(signum)
        return "failed", 128 + signum, f"terminated by signal {name}"
    return ("completed" if code == 0 else "failed"), code, ""


def _wait(proc: subprocess.Popen[bytes], timeout: int) -> tuple[int | None, str]:
    """Wait for the command; return its exit status and how it ended (exited, timeout, cancelled).

    Waits in short slices so that a cancel (SIGTERM to us) escalates to SIGKILL in time.
    """
    deadline = time.monotonic() + timeout if timeout > 0 else None
    cancelled_at: float | None = None
    while True:
        if _Cancel.requested and cancelled_at is None:
            cancelled_at = time.monotonic()
            _signal_group(proc.pid, signal.SIGTERM)
        try:
            code = proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if cancelled_at is not None and now - cancelled_at >= CANCEL_GRACE_SECONDS:
                _signal_group(proc.pid, signal.SIGKILL)
            if cancelled_at is None and deadline is not None and now >= deadline:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
                return None, "timeout"
            continue
        return code, "cancelled" if _Cancel.requested else "exited"


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def supervise(job_dir: Path, timeout: int, max_output_bytes: int) -> None:
    """Run the claimed job's request once and write ``result.json``."""
    request = json.loads((job_dir / REQUEST_FILE).read_text(encoding="utf-8"))
    work_dir = (job_dir / WORK_DIR).resolve()
    work_dir.mkdir(exist_ok=True)
    argv = [str(arg) for arg in request["sandbox"]["command"]]
    started_at = now_rfc3339()
    if _Cancel.requested or (job_dir / CANCEL_FILE).exists():
        status, exit_code, note = "cancelled", None, "cancelled before it started"
    else:
        status, exit_code, note = _run(argv, work_dir, job_env(request, work_dir), job_dir, timeout)
    ended_at = now_rfc3339()
    stdout, stdout_truncated = _read_head(job_dir / STDOUT_FILE, max_output_bytes)
    stderr, stderr_truncated = _read_head(job_dir / STDERR_FILE, max_output_bytes)
    if note:
        stderr = f"{stderr}\n{_NOTE}{note}" if stderr else f"{_NOTE}{note}"
    result = {
        "version": 1,
        "task_id": request["task_id"],
        "job_id": request["job_id"],
        "status": status,
        "exit_code": exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "started_at": started_at,
        "ended_at": ended_at,
        "truncated": {"stdout": stdout_truncated, "stderr": stderr_truncated},
        "work_dir": str(work_dir),
        "target": "local",
    }
    write_atomic(job_dir / RESULT_FILE, json.dumps(result).encode())


def main(argv: list[str]) -> int:
    """Fork the supervisor off and exit once it has claimed the job (0) or could not (1).

    The engine starts this through asyncio, which kills a child it still tracks when the
    subprocess transport is closed or collected (a cancelled `run`, a shutting-down loop). So the
    process asyncio knows only lives until the claim; the forked supervisor is nobody's business
    but its own (reparented to init), as a detached job must be.
    """
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    job_dir, timeout, max_output_bytes = Path(argv[1]), int(argv[2]), int(argv[3])
    ready_r, ready_w = os.pipe()
    if os.fork() > 0:
        os.close(ready_w)
        return 0 if os.read(ready_r, 1) == b"1" else 1
    os.close(ready_r)
    # Before the claim makes our pid visible: a cancel's SIGTERM must find the handler.
    signal.signal(signal.SIGTERM, _Cancel.on_sigterm)
    claimed = write_atomic(job_dir / PID_FILE, str(os.getpid()).encode(), exclusive=True)
    with contextlib.suppress(BrokenPipeError):  # the launcher may be gone; we carry on
        os.write(ready_w, b"1" if claimed else b"0")
    os.close(ready_w)
    if not claimed:
        print("job already claimed; not running it again", file=sys.stderr)
        return 1
    supervise(job_dir, timeout, max_output_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
