"""Which user a task's local jobs run as, when the engine is root: allocated, never derived.

Each task's jobs run as a user id of their own (`sandbox._grant`), so that no other task's job can
read its files, signal or trace its processes, or read their environment. The id must then be
unique among the tasks whose jobs may still run or whose work directories are kept, and no
caller may choose it: an id computed from the task id (as earlier versions did) lets a tenant
pick a task id whose id is another tenant's.

So ids are drawn at random from the configured range and recorded in the jobs directory, in
``.users/``, as symbolic links (made exclusively and read in one step each, so a record is
never seen half written): ``uid-<uid>`` (pointing at the task id) reserves the id across every
process sharing the directory (the engine's processes, or a worker node's), and ``task-<digest
of the task id>`` (pointing at the uid) names the task's id for its later jobs. The task's jobs
touch its record (at most once a minute); `release_idle` frees the ids of tasks none of whose
jobs started for longer than any job may run plus the retention of its directory, when no job
of theirs can run or be kept any more.

A "task" here is a job's workspace (`JobRequest.workspace`): its task id and the id of the
workflow run, so that a task id started again after its rows were pruned (by another tenant,
say) draws a user of its own, never the one the earlier run's files and processes have. A job
whose engine names no run (one before state format 4) is keyed by its task id alone.

Jobs started by an earlier version keep the user they were started with until they end.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import time
from collections import OrderedDict
from pathlib import Path

from workflow_engine.domain.held import Held

#: Random draws before the range is taken for full (a draw finds a free id with probability
#: 1 - used / count, so this fails only when the range is nearly all taken).
_DRAWS = 64
#: How often a task's file is touched while its jobs start (idle means days: see `prune`).
_TOUCH_SECONDS = 60.0
#: Tasks whose ids are remembered in memory (those looked up within `_TOUCH_SECONDS`), least
#: recently used dropped first.
_KNOWN_TASKS = 4096


class JobUsers:
    """The user ids of tasks' jobs in one jobs directory (see the module docstring)."""

    def __init__(self, jobs_dir: Path, *, base: int, count: int) -> None:
        self._dir = jobs_dir / ".users"
        self._base = base
        self._count = count
        self._made = False
        # The ids this process looked up lately, and when it last touched their task's file:
        # a task's next job within `_TOUCH_SECONDS` costs a lookup here, no file operation.
        self._known: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def held(self) -> list[Held]:
        return [Held("sandbox.users_known", len(self._known), _KNOWN_TASKS)]

    def for_task(self, task_id: str) -> int | None:
        """The user id of `task_id`'s jobs, allocated at its first job; None when every id of
        the range is taken."""
        known = self._known.get(task_id)
        now = time.monotonic()
        if known is not None and now - known[1] < _TOUCH_SECONDS:
            return known[0]
        uid = self._lookup(task_id)
        if uid is not None:
            self._known[task_id] = (uid, now)
            self._known.move_to_end(task_id)
            # Oldest first: one looked up more than `_TOUCH_SECONDS` ago is of no more use.
            while self._known and (
                len(self._known) > _KNOWN_TASKS
                or now - next(iter(self._known.values()))[1] >= _TOUCH_SECONDS
            ):
                self._known.popitem(last=False)
        return uid

    def _lookup(self, task_id: str) -> int | None:
        if not self._made:
            self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._made = True
        named = self._dir / f"task-{hashlib.sha256(task_id.encode()).hexdigest()}"
        for _ in range(_DRAWS):
            uid = _read_uid(named)
            if uid is not None:
                with contextlib.suppress(FileNotFoundError):  # released meanwhile: again
                    os.utime(named, follow_symlinks=False)
                    return uid
                continue
            drawn = self._reserve(task_id)
            if drawn is None:
                return None
            if _record(named, str(drawn)):
                return drawn
            (self._dir / f"uid-{drawn}").unlink(missing_ok=True)  # another job named one first
        raise OSError(f"{named}: the task's user id kept changing while it was read")

    def release_idle(self, idle_seconds: float) -> int:
        """Free the ids of tasks with no job started for `idle_seconds`; how many it freed."""
        cutoff = time.time() - idle_seconds
        self._known.clear()  # what it frees must be looked up afresh
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
            if _record(self._dir / f"uid-{uid}", task_id):
                return uid
        return None


def _record(path: Path, value: str) -> bool:
    """Make `path` a record of `value` unless it exists; whether this call made it."""
    try:
        os.symlink(value, path)
    except FileExistsError:
        return False
    return True


def _read_uid(path: Path) -> int | None:
    """The uid `path` records; None when there is no such record (one that records none, which
    nothing here makes, is removed: it names no id to keep)."""
    try:
        text = os.readlink(path)
    except FileNotFoundError:
        return None
    except OSError:  # not a record of ours (a file, say)
        text = ""
    if text.isdigit():
        return int(text)
    path.unlink(missing_ok=True)
    return None
