"""Which user a task's local jobs run as, when the engine is root: allocated, never derived.

Each task's jobs run as a user id of their own (`job_grant`), so that no other task's job can
read its files, signal or trace its processes, or read their environment. The id must then be
unique among the tasks whose jobs may still run or whose work directories are kept, and no
caller may choose it: an id computed from the task id (as earlier versions did) lets a tenant
pick a task id whose id is another tenant's.

So ids are drawn at random from the configured range and recorded in the jobs directory, in
``.users/``: ``uid-<uid>`` (holding the task id) is created exclusively, which reserves the id
across every process sharing the directory (the engine's processes, or a worker node's), and
``task-<digest of the task id>`` (holding the uid) names the task's id for its later jobs. Each
job of the task touches its task file; `release_idle` frees the ids of tasks none of whose jobs
started for longer than any job may run plus the retention of its directory, when no job of
theirs can run or be kept any more.

Jobs started by an earlier version keep the user they were started with until they end.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import time
from pathlib import Path

from workflow_engine.capabilities import job_files as files

#: Random draws before the range is taken for full (a draw finds a free id with probability
#: 1 - used / count, so this fails only when the range is nearly all taken).
_DRAWS = 64


class JobUsers:
    """The user ids of tasks' jobs in one jobs directory (see the module docstring)."""

    def __init__(self, jobs_dir: Path, *, base: int, count: int) -> None:
        self._dir = jobs_dir / ".users"
        self._base = base
        self._count = count

    def for_task(self, task_id: str) -> int | None:
        """The user id of `task_id`'s jobs, allocated at its first job; None when every id of
        the range is taken."""
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        named = self._dir / f"task-{hashlib.sha256(task_id.encode()).hexdigest()}"
        for _ in range(_DRAWS):
            uid = _read_uid(named)
            if uid is not None:
                with contextlib.suppress(FileNotFoundError):  # released meanwhile: again
                    os.utime(named)
                    return uid
                continue
            drawn = self._reserve(task_id)
            if drawn is None:
                return None
            if files.write_atomic(named, str(drawn).encode(), exclusive=True):
                return drawn
            (self._dir / f"uid-{drawn}").unlink(missing_ok=True)  # another job named one first
        raise OSError(f"{named}: the task's user id kept changing while it was read")

    def release_idle(self, idle_seconds: float) -> int:
        """Free the ids of tasks with no job started for `idle_seconds`; how many it freed."""
        cutoff = time.time() - idle_seconds
        freed = 0
        try:
            entries = list(os.scandir(self._dir))
        except FileNotFoundError:
            return 0
        for entry in entries:
            if not entry.name.startswith("task-"):
                continue
            with contextlib.suppress(FileNotFoundError):
                if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                    continue
                uid = _read_uid(Path(entry.path))
                os.unlink(entry.path)
                if uid is not None:
                    (self._dir / f"uid-{uid}").unlink(missing_ok=True)
                freed += 1
        return freed

    def _reserve(self, task_id: str) -> int | None:
        for _ in range(_DRAWS):
            uid = self._base + secrets.randbelow(self._count)
            if files.write_atomic(self._dir / f"uid-{uid}", task_id.encode(), exclusive=True):
                return uid
        return None


def _read_uid(path: Path) -> int | None:
    """The uid `path` names; None when there is no such file (one that names none, which
    nothing here writes, is removed: it names no id to keep)."""
    try:
        text = path.read_bytes().strip()
    except FileNotFoundError:
        return None
    if text.isdigit():
        return int(text)
    path.unlink(missing_ok=True)
    return None
