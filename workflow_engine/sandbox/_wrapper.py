"""The wrapper each local job runs under, and how the runner spawns it.

``jobwrap`` (`JOBWRAP`, ``jobwrap.c``, built with the package) or, where it was not built and
the engine is not root, the ``/bin/sh`` script `WRAPPER` with util-linux ``unshare``: it claims
the job, applies the grant (`sandbox._grant`), runs the command, keeps the deadline once the
engine is gone and records the exit status (`sandbox._runner` says how, and why it costs about a
fork/exec). This module holds the wrapper itself, the choice between the two, and the
``posix_spawn`` of each with its file descriptors, environment and arguments; the runner says
when (`sandbox._runner`), and `sandbox._files` is the job directory they share.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import structlog

from workflow_engine.domain.jobs import JobRequest
from workflow_engine.sandbox import _files as files
from workflow_engine.sandbox._grant import Grant

log = structlog.get_logger(__name__)

#: The wrapper: ``sh -c WRAPPER JOB_DIR DEADLINE GRACE SLEEP ULIMITS... -- COMMAND...``, where
#: ULIMITS are ``OPTION VALUE`` pairs ("-" for none) and COMMAND begins with the grant's prefix
#: (`sandbox._grant`: no network, the job's own user). Its files are its engine's alone (umask 077;
#: the command gets the usual 022), and the limits hold from just before the command on. Its
#: stdout and stderr are on ``supervisor.log``, fd 3 the read end of the engine's pipe;
#: ``$REQUEST_ENV`` holds the request, which it writes to ``request.json``. ``$0`` is the job
#: dir so that a re-attaching engine can tell the wrapper's pid from a reused one
#: (/proc/PID/cmdline). DEADLINE is in whole seconds of /proc/uptime. The watchdog ignores a
#: cancel's SIGTERM (it is what stops a cancelled job after GRACE when the engine is gone); the
#: wrapper's trap runs once the command has ended.
WRAPPER = """cd "$0" || exit 96
umask 077
set -C
echo "$$" >supervisor.pid || exit 97
set +C
trap 'kill -9 0' TERM
[ ! -e cancel ] || exit 98
printf '%s\\n' "$WORKFLOW_ENGINE_JOB_REQUEST" >request.json
unset WORKFLOW_ENGINE_JOB_REQUEST
cd work || exit 96
deadline=$1 grace=$2 sleep=$3
shift 3
{
  trap '' TERM
  read -r _ <&3
  if [ -e ../cancel ]; then
    "$sleep" "$grace"
  else
    read -r now _ </proc/uptime || now=0
    now=${now%.*}
    [ "$now" -ge "$deadline" ] || "$sleep" "$((deadline - now))"
    : >../timed_out
  fi
  kill -9 0
} &
while [ "$1" != -- ]; do
  [ "$2" = - ] || ulimit $1 "$2" || exit 95
  shift 2
done
shift
: >../stdout.log
: >../stderr.log
umask 022
"$@" 3<&- >../stdout.log 2>../stderr.log
echo "$?" >../exit_status
kill -9 0
"""
REQUEST_ENV = "WORKFLOW_ENGINE_JOB_REQUEST"
#: The whole environment of ``jobwrap``, which runs as root: fixed, nothing of the job's.
WRAPPER_ENV = {"PATH": files.SAFE_PATH, "LANG": "C.UTF-8"}
#: The same wrapper as a small program (``jobwrap.c``, built beside it when the package is
#: installed): one exec instead of three and no watchdog fork, so a job costs about half.
JOBWRAP = Path(__file__).with_name("jobwrap")
_SHELL = "/bin/sh"
#: Whether `jobwrap_not_built` was logged in this process.
_TOLD_NOT_BUILT: list[bool] = []
NEEDS_JOBWRAP = (
    f"refused: as root, local jobs run only through jobwrap, which keeps the job's environment "
    f"from every process that runs as root, and it is not built here ({JOBWRAP}); install the "
    f"package where a C compiler is (cc), or run `make install`"
)


def choose_wrapper(wrapper: str) -> str | None:
    """The path of `JOBWRAP` when it is to be used, None for the shell wrapper."""
    if wrapper not in ("auto", "jobwrap", "sh"):
        raise ValueError(f"wrapper: expected auto, jobwrap or sh, not {wrapper!r}")
    built = os.access(JOBWRAP, os.X_OK)
    if wrapper == "jobwrap" and not built:
        raise FileNotFoundError(f"{JOBWRAP} is not built (see jobwrap.c)")
    if wrapper == "auto" and not built and not _TOLD_NOT_BUILT:
        _TOLD_NOT_BUILT.append(True)
        log.warning(
            "jobwrap_not_built",
            path=str(JOBWRAP),
            effect="local jobs are refused (as root)"
            if os.geteuid() == 0
            else "local jobs run through the shell wrapper, at more CPU per job",
            fix="install the package where a C compiler is (cc), or run `make install`",
        )
    if wrapper == "sh" or not built:
        return None
    return str(JOBWRAP)


def may_run(jobwrap: str | None) -> bool:
    """Whether a runner with this wrapper (None: the shell's) may start jobs: as root, only
    ``jobwrap``, which keeps the job's environment from every process that runs as root. The
    shell wrapper and util-linux ``unshare`` would run as root with it (``LD_PRELOAD``, say)."""
    return jobwrap is not None or os.geteuid() != 0


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
        actions = [*_file_actions(os.devnull, engine_pipe), (os.POSIX_SPAWN_DUP2, job_data, 6)]
        isolation = grant.isolation
        if shared:  # jobwrap enters them: the network namespace on fd 4, the user's on 5
            isolation = "join-" + isolation
            actions += [(os.POSIX_SPAWN_DUP2, fd, 4 + i) for i, fd in enumerate(shared)]
        uid = "-" if grant.uid is None else str(grant.uid)
        argv = [jobwrap, str(job_dir), str(deadline), str(grace), isolation, uid, str(task_tmp)]
        argv += [*grant.rlimit_args(), "--", *job.sandbox.command]
        return _spawn(jobwrap, argv, dict(WRAPPER_ENV), actions)
    finally:
        os.close(job_data)


def spawn_shell(
    job: JobRequest,
    job_dir: Path,
    grant: Grant,
    *,
    sleep_bin: str,
    deadline: int,
    grace: float,
    engine_pipe: int,
) -> int:
    """Start the shell wrapper `WRAPPER` for the job; its pid.

    Never as root (`may_run`): the shell wrapper and util-linux `unshare` run with the job's
    environment, as the engine's own user."""
    request = job.to_json()
    work_dir = job_dir / files.WORK_DIR
    job_env = files.job_env(request, work_dir)
    os.mkdir(work_dir, 0o700)
    if grant.uid is not None:
        os.chown(work_dir, grant.uid, grant.uid)
    env = {**job_env, REQUEST_ENV: json.dumps(request)}
    argv = [_SHELL, "-c", WRAPPER, str(job_dir), str(deadline), str(grace)]
    argv += [sleep_bin, *grant.ulimit_args(), "--", *grant.prefix]
    argv += job.sandbox.command
    actions = _file_actions(str(job_dir / files.LOG_FILE), engine_pipe)
    return _spawn(_SHELL, argv, env, actions)


def _file_actions(log_path: str, engine_pipe: int) -> list[tuple[object, ...]]:
    """A wrapper's stdin (nothing), stdout and stderr (`log_path`), and fd 3: the engine's pipe."""
    return [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
        (os.POSIX_SPAWN_DUP2, engine_pipe, 3),
    ]


def _spawn(
    program: str, argv: list[str], env: dict[str, str], actions: list[tuple[object, ...]]
) -> int:
    return os.posix_spawn(
        program,
        argv,
        env,
        file_actions=actions,
        # Its own session: signals to the engine's process group do not reach it.
        setsid=True,
        # Python ignores these; a command gets them as a shell would give them.
        setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
    )
