"""The wrapper each local job runs under, ``jobwrap``, and how the runner spawns it.

``jobwrap`` (`JOBWRAP`, ``jobwrap.c``, built with the package) claims the job, applies the
grant (`sandbox._grant`), runs the command, keeps the deadline once the engine is gone and
records the exit status (`sandbox._runner` says how, and why it costs about a fork/exec). It is
the one implementation of that protocol: where it was not built, the local sandbox and a worker
node refuse to start (`require_jobwrap`). This module holds its path, that check, and its
``posix_spawn`` with its file descriptors, environment and arguments; the runner says when
(`sandbox._runner`), and `sandbox._files` is the job directory they share.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from workflow_engine.domain.jobs import JobRequest
from workflow_engine.errors import CapabilityConfigError
from workflow_engine.sandbox import _files as files
from workflow_engine.sandbox._grant import Grant

#: The whole environment of ``jobwrap``, which runs as root: fixed, nothing of the job's.
WRAPPER_ENV = {"PATH": files.SAFE_PATH, "LANG": "C.UTF-8"}
#: The wrapper as a small program (``jobwrap.c``, built beside it when the package is
#: installed: setup.py, or `make install` in a checkout).
JOBWRAP = Path(__file__).with_name("jobwrap")


def require_jobwrap() -> str:
    """The path of `JOBWRAP`; `CapabilityConfigError` saying how to build it when it is not
    built (installed where there was no C compiler)."""
    if os.access(JOBWRAP, os.X_OK):
        return str(JOBWRAP)
    raise CapabilityConfigError(
        f"local jobs run only through jobwrap, the job wrapper the package builds from "
        f"jobwrap.c, and it is not built: {JOBWRAP} is missing or not executable. Build it "
        f"with `make install` in a checkout, or install a C compiler (cc) and reinstall the "
        f"package; the container image and the release wheel have it built"
    )


def spawn_jobwrap(
    jobwrap: str,
    job: JobRequest,
    job_dir: Path,
    grant: Grant,
    *,
    deadline: int,
    grace: float,
    engine_pipe: int,
    shared: tuple[int, ...],
    task_tmp: Path,
) -> int:
    """Start `jobwrap` for the job; its pid. `shared`: the task's namespaces to enter, else ().

    jobwrap runs as root: its environment is the fixed one, and the job's own reaches the
    command only after it became the job's user (read from fd 6). It makes the work directory
    and, only if it has something to say, its log: off this process's thread, and no file at
    all for a job that goes well."""
    request = job.to_json()
    job_env = files.job_env(request, job_dir / files.WORK_DIR)
    job_data = files.job_data(request, job_env)
    try:
        actions = [*_file_actions(engine_pipe), (os.POSIX_SPAWN_DUP2, job_data, 6)]
        isolation = grant.isolation
        if shared:  # jobwrap enters them: the network namespace on fd 4, the user's on 5
            isolation = "join-" + isolation
            actions += [(os.POSIX_SPAWN_DUP2, fd, 4 + i) for i, fd in enumerate(shared)]
        uid = "-" if grant.uid is None else str(grant.uid)
        argv = [jobwrap, str(job_dir), str(deadline), str(grace), isolation, uid, str(task_tmp)]
        argv += [*grant.rlimit_args(), "--", *job.sandbox.command]
        return os.posix_spawn(
            jobwrap,
            argv,
            dict(WRAPPER_ENV),
            file_actions=actions,
            # Its own session: signals to the engine's process group do not reach it.
            setsid=True,
            # Python ignores these; a command gets them as a shell would give them.
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
        )
    finally:
        os.close(job_data)


def _file_actions(engine_pipe: int) -> list[tuple[object, ...]]:
    """jobwrap's stdin, stdout and stderr (nothing: it writes its log itself, and only when it
    has something to say), and fd 3: the engine's pipe."""
    return [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_DUP2, 1, 2),
        (os.POSIX_SPAWN_DUP2, engine_pipe, 3),
    ]
