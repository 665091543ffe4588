"""A job's wrapper as a process: waiting for it to end, reaping it, signalling it.

The runner waits on the child it spawned, and a re-attaching runner on a wrapper some other
process started (`sandbox._runner`), both on a pidfd where the kernel has them; a pid is only
signalled while it is still this job's wrapper, so a reused pid is never hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

from workflow_engine.sandbox import _files as files

#: The longest a poll for a process or a claim waits between looks.
MAX_POLL_INTERVAL = 0.5


def deadline_passed(pid: int, job_dir: Path) -> None:
    """Stop a job at its deadline: what its watchdog does when the engine is gone.

    Our child, not reaped yet: its group id cannot be a reused one.
    """
    files.mark_timed_out(job_dir)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def until_exited(pid: int, poll: Callable[[], int | None], interval: float) -> None:
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
            interval = min(interval * 1.5, MAX_POLL_INTERVAL)
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


def reap(pid: int) -> None:
    """Reap our child `pid`, which has exited (so this does not block)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def exited_child(pid: int) -> int | None:
    """0 once our child `pid` has exited, None while it runs; it is left for `wait` to reap."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return 0  # reaped already
    return None if info is None else 0


def is_wrapper(pid: int, job_dir: Path) -> bool:
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


def signal_wrapper(pid: int, job_dir: Path, signum: int) -> bool:
    """Send `signum` to the job's process group while its wrapper runs; whether it did.

    A running wrapper holds its group id, so the group cannot be a reused one.
    """
    if not is_wrapper(pid, job_dir):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)
        return True
    return False
