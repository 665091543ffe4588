"""A lock file that holds its holder's pid: one process at a time per directory.

An advisory `flock` on an open file: the kernel lets go of it when its holder ends, however it
ends (SIGKILL included), so a holder that crashed never blocks the next one, and the pid in the
file lets a process that finds the lock taken say whom it found.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def held(path: Path, when_taken: Callable[[str], None]) -> Iterator[None]:
    """Hold `path`'s lock for the block, with this process's pid in the file.

    When another process holds it, `when_taken` gets that process's pid (``unknown`` if it has
    not written it yet): raise from it to give up, or return to wait for the lock (a signal
    still ends the wait)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as handle:
        if not _locked_at_once(handle):
            handle.seek(0)
            when_taken(handle.read().strip() or "unknown")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.truncate(0)
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        yield


def _locked_at_once(handle: IO[str]) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
