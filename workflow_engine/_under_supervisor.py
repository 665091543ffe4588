"""The engine's side of running under a supervisor (see `supervisor`).

An engine the supervisor started finds two variables in its environment: a file descriptor on
which it says it serves, and the supervisor's pid. It asks the kernel for SIGTERM when the
supervisor dies, so a killed supervisor leaves no engine behind (each drains as on any SIGTERM).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

#: Set in an engine's environment by the supervisor: the file descriptor on which the engine
#: says it serves (its pid and a newline), and the supervisor's pid (for `die_with_parent`).
READY_FD_ENV = "WORKFLOW_ENGINE_SUPERVISOR_READY_FD"
PARENT_ENV = "WORKFLOW_ENGINE_SUPERVISOR_PID"
_PR_SET_PDEATHSIG = 1


def supervised() -> bool:
    """Whether this process is an engine started by a supervisor."""
    return READY_FD_ENV in os.environ


def die_with_parent() -> None:
    """Ask the kernel for SIGTERM when the supervisor dies (Linux); leave if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(os.environ.get(PARENT_ENV, "0") or 0):
        os.kill(os.getpid(), signal.SIGTERM)  # the supervisor died before the request


def report_serving() -> None:
    """Tell the supervisor this engine serves (once; the descriptor is closed after)."""
    fd = int(os.environ[READY_FD_ENV])
    with contextlib.suppress(OSError):
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
