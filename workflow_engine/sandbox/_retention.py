"""What the runner's `prune` removes: expired job directories, idle task /tmp directories.

A job's directory is kept `retention_seconds` after its result was recorded (see
`sandbox._runner`); these walk the jobs directory for what has passed that, and remove it even
where a job left directories without our permissions, never following a link out.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shutil
import time
from collections import OrderedDict
from pathlib import Path

import structlog

from workflow_engine.domain.held import Held
from workflow_engine.domain.task import MAX_TIMEOUT_SECONDS
from workflow_engine.sandbox import _files as files

log = structlog.get_logger(__name__)

#: How a directory being removed by `JobRunner.prune` begins (never a job's: those begin with
#: a letter or digit).
PRUNED = ".pruned-"
#: Where the tasks' /tmp directories are, in the jobs directory (a dot name: never a job's).
_TASK_TMP = ".tmp"
#: How often a task's /tmp is touched while its jobs start (idle means days: see `prune`).
_TOUCH_SECONDS = 60.0
#: Tasks whose last touch is remembered (only those within `_TOUCH_SECONDS` are of use).
_TOUCHED_TASKS = 4096


class TaskTmp:
    """The tasks' own /tmp directories in one jobs directory, and when this process last
    touched each (so that `JobRunner.prune` keeps those a job may still use)."""

    def __init__(self, jobs_dir: Path) -> None:
        self.root = jobs_dir / _TASK_TMP
        # The ones touched lately; at most `_TOUCHED_TASKS`, least recently touched dropped.
        self._touched: OrderedDict[Path, float] = OrderedDict()

    def held(self) -> list[Held]:
        return [Held("sandbox.task_tmp_touched", len(self._touched), _TOUCHED_TASKS)]

    def path(self, task_id: str, uid: int | None) -> Path:
        """The task's own /tmp (and /dev/shm), which its jobs share and no other job sees:
        made at its first job, its user's, touched (at most once a minute) so that `prune`
        keeps it while a job of the task may still run or be kept."""
        path = self.root / hashlib.sha256(task_id.encode()).hexdigest()[:32]
        now = time.monotonic()
        if now - self._touched.get(path, -math.inf) < _TOUCH_SECONDS:
            return path
        try:
            os.utime(path)
        except FileNotFoundError:
            self.root.mkdir(mode=0o711, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
        if uid is not None and os.stat(path).st_uid != uid:
            os.chown(path, uid, uid)  # made just now, or its task's user was drawn afresh
        self._touched[path] = now
        self._touched.move_to_end(path)
        # Oldest first: one touched more than `_TOUCH_SECONDS` ago would be touched again.
        while self._touched and (
            len(self._touched) > _TOUCHED_TASKS
            or now - next(iter(self._touched.values())) >= _TOUCH_SECONDS
        ):
            self._touched.popitem(last=False)
        return path

    def forget(self) -> None:
        """Look at every task's directory afresh (after a prune)."""
        self._touched.clear()


def expired(jobs_dir: Path, cutoff: float) -> list[Path]:
    """The entries of `jobs_dir` to remove: job directories whose result was recorded before
    `cutoff` (or, with no result, that last changed before `cutoff` by more than any job may
    run), and what an interrupted prune left."""
    expired: list[Path] = []
    try:
        entries = list(os.scandir(jobs_dir))
    except FileNotFoundError:
        return expired
    for entry in entries:
        path = Path(entry.path)
        if entry.name.startswith(PRUNED):
            expired.append(path)
            continue
        if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if (path / files.RESULT_FILE).stat().st_mtime < cutoff:
                expired.append(path)
        except FileNotFoundError:
            with contextlib.suppress(FileNotFoundError):
                if entry.stat(follow_symlinks=False).st_mtime < cutoff - MAX_TIMEOUT_SECONDS:
                    expired.append(path)
    return expired


def idle_entries(directory: Path, idle_seconds: float) -> list[Path]:
    """The entries of `directory` that have not changed for `idle_seconds`."""
    cutoff = time.time() - idle_seconds
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return []
    idle = []
    for entry in entries:
        with contextlib.suppress(FileNotFoundError):
            if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                idle.append(Path(entry.path))
    return idle


def remove(paths: list[Path]) -> None:
    """Remove these directories and all in them, also what a job made unreadable."""
    for path in paths:
        try:
            shutil.rmtree(path)
        except OSError:  # a job left directories without our permissions: give them back
            _own_dir(str(path))
            for parent, names, _ in os.walk(path):  # top down: each before it is listed
                for name in names:
                    _own_dir(os.path.join(parent, name))
            try:
                shutil.rmtree(path)
            except OSError as exc:
                log.warning("job_dir_prune_failed", job_dir=str(path), error=str(exc))


def _own_dir(path: str) -> None:
    """Make directory `path` ours to list and empty; never through a symbolic link."""
    with contextlib.suppress(OSError):
        # O_PATH opens even a directory without permissions; /proc names the one opened.
        fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.chmod(f"/proc/self/fd/{fd}", 0o700)
        finally:
            os.close(fd)
