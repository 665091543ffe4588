"""Job users are allocated per task, unique in their jobs directory, and freed when idle."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from workflow_engine.sandbox import _users as users_module
from workflow_engine.sandbox._users import JobUsers


def test_a_task_keeps_its_user_and_no_two_tasks_share_one(tmp_path: Path) -> None:
    users = JobUsers(tmp_path, base=1000, count=200)
    tasks = [str(uuid.uuid4()) for _ in range(150)]
    allocated = [users.for_task(t) for t in tasks]
    assert len(set(allocated)) == len(tasks)
    assert all(uid is not None and 1000 <= uid < 1200 for uid in allocated)
    # Another process sharing the directory (the engine's others, a restart) sees the same.
    again = JobUsers(tmp_path, base=1000, count=200)
    assert [again.for_task(t) for t in tasks] == allocated


def test_a_full_range_allocates_none_and_idle_tasks_free_theirs(tmp_path: Path) -> None:
    users = JobUsers(tmp_path, base=5000, count=3)
    first = [str(uuid.uuid4()) for _ in range(3)]
    held = {users.for_task(t) for t in first}
    assert held == {5000, 5001, 5002}
    assert users.for_task(str(uuid.uuid4())) is None
    long_ago = time.time() - 3600
    idle = next(iter(tmp_path.joinpath(".users").glob("task-*")))
    os.utime(idle, (long_ago, long_ago), follow_symlinks=False)  # a record is a link
    assert users.release_idle(1800) == 1
    assert users.for_task(str(uuid.uuid4())) in held  # the freed one
    assert users.release_idle(1800) == 0


def test_only_tasks_looked_up_within_a_minute_stay_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's id is remembered only while it saves a lookup (issue 62: nothing of a task
    whose jobs are long done stays in memory); the next one reads its file again."""
    now = [1000.0]
    monkeypatch.setattr(users_module.time, "monotonic", lambda: now[0])
    users = JobUsers(tmp_path, base=1000, count=200)
    old = [users.for_task(str(uuid.uuid4())) for _ in range(50)]
    assert users.held()[0].entries == 50
    now[0] += 61
    task = str(uuid.uuid4())
    uid = users.for_task(task)
    assert users.held()[0].entries == 1
    assert uid is not None and uid not in old
    assert users.for_task(task) == uid
