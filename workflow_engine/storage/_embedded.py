"""An embedded PostgreSQL server for when no database URL is configured.

`pgserver` ships the server binaries inside its wheel and, when we run as root, runs them as an
unprivileged system user, so `workflow-engine serve` works on a fresh machine with nothing else
installed.

Its lifetime is the process's that started it: `close` stops the server when this process
started it and no other live process holds a pgserver handle on it. A server that was already
running when this process looked (left by an engine killed with kill -9, or started by another
tool) is reused and left running; the log gives the command that stops it. pgserver's own
clean-up is not used for this: it runs only at interpreter exit, counts users by pid without
noticing dead ones (after one kill -9 it never stops the server again), and would stop a server
this process only found.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import signal
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger(__name__)

_STOP_TIMEOUT_SECONDS = 60.0


class EmbeddedPostgres:
    """A handle on the embedded server for one data directory (see the module docstring)."""

    def __init__(self, pgdata: Path, server: Any, *, started_here: bool) -> None:
        self.pgdata = pgdata
        #: Whether this process started the server (else it found it running and leaves it so).
        self.started_here = started_here
        self.url = str(server.get_uri())
        self._server = server  # a pgserver.PostgresServer
        self._closed = False

    @property
    def stop_command(self) -> str:
        """A shell command that stops the server (PostgreSQL's fast shutdown), for operators."""
        pid_file = shlex.quote(str(self.pgdata / "postmaster.pid"))
        return f'kill -INT "$(head -1 {pid_file})"'

    def close(self, *, timeout: float = _STOP_TIMEOUT_SECONDS) -> None:
        """Release this process's handle; stop the server if this process started it.

        Left running, and logged with the stop command, when another live process still holds
        a handle on it. Serialised with `start_embedded_postgres`, so a process starting up
        either sees the server stopped (and starts it) or is seen using it.
        """
        if self._closed:
            return
        self._closed = True
        with _locked(self.pgdata):
            others = self._other_users()
            self._server.cleanup()  # drops our pid from pgserver's list; cleanup_mode=None
            if not self.started_here:
                self._left_running("it was running before this process started")
            elif others:
                self._left_running("other processes still use it", pids=others)
            elif _stop(self.pgdata, timeout):
                log.info("embedded_postgres_stopped", pgdata=str(self.pgdata))
            else:
                self._left_running(f"it did not stop within {timeout:.0f} s")

    def __enter__(self) -> EmbeddedPostgres:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _other_users(self) -> list[int]:
        pids = self._server.global_process_id_list.get()
        return [pid for pid in pids if pid != os.getpid() and _alive(pid)]

    def _left_running(self, reason: str, **fields: Any) -> None:
        log.info(
            "embedded_postgres_left_running",
            pgdata=str(self.pgdata),
            reason=reason,
            stop_command=self.stop_command,
            **fields,
        )


def start_embedded_postgres(pgdata: Path) -> EmbeddedPostgres:
    """Start the server for `pgdata`, or find it running; `close` the handle when done."""
    # Deferred: importing it is not free and only this path needs it. It asks platformdirs for
    # a runtime directory, which warns when XDG_RUNTIME_DIR is unset (always, in containers).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pgserver.postgres_server import get_server

    pgdata = pgdata.resolve()
    pgdata.mkdir(parents=True, exist_ok=True)
    with _locked(pgdata):
        found = _postmaster_pid(pgdata)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = get_server(pgdata, cleanup_mode=None)
    if _postmaster_pid(pgdata) is None:
        # get_server caches its handle per directory; after `close` stopped the server, this
        # process gets the stale handle back.
        raise RuntimeError(f"the embedded server for {pgdata} was stopped by this process")
    embedded = EmbeddedPostgres(pgdata, server, started_here=found is None)
    log.info(
        "embedded_postgres_ready",
        pgdata=str(pgdata),
        started=embedded.started_here,
        stop_command=embedded.stop_command,
    )
    return embedded


@contextlib.contextmanager
def _locked(pgdata: Path) -> Iterator[None]:
    """Serialise this module's start and stop decisions for `pgdata` across processes."""
    fd = os.open(pgdata, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _postmaster_pid(pgdata: Path) -> int | None:
    """The pid of the postmaster serving `pgdata`, or None when none is running."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    return pid if _serves(pid, pgdata) else None


def _serves(pid: int, pgdata: Path) -> bool:
    """Whether `pid` runs and is a postmaster for `pgdata` (not a pid reused since)."""
    proc = Path("/proc") / str(pid)
    if not proc.parent.is_dir():  # no /proc to ask: trust the pid file
        return _alive(pid)
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
        return False  # exited; nobody reaped it yet
    return str(pgdata).encode() in cmdline


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _stop(pgdata: Path, timeout: float) -> bool:
    """Fast shutdown (SIGINT: end sessions, checkpoint, exit); whether it ended in `timeout`."""
    pid = _postmaster_pid(pgdata)
    if pid is None:
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + timeout
    while _serves(pid, pgdata):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
