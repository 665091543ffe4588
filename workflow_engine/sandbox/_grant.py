"""What a local job is granted: its user, its limits, no network, or a refusal saying why.

A local job (the embedded sandbox's, or a `worker-node`'s) runs with only what it was granted:

- **Its task's own user.** When the engine runs as root, each job's command runs as the user
  id of its task's run (`JobRequest.workspace`: a task id started anew gets a new one), drawn
  from `JobSettings.uid_base` on and recorded by the runner
  (`sandbox._users`: never derived from the task id a caller chose; a workflow's steps and
  attempts share it and may share files, other workflows' jobs may not touch them), with no
  supplementary groups and no capabilities; its work directory is that user's and nobody
  else's. The job's wrapper stays the engine's user, so the files that make up its result
  (exit status, claim) are out of the command's reach. Not root: the job runs as the
  engine's user.
- **Its own processes and mounts** (``jobwrap``; see there): a PID namespace whose init ends
  every process of the job when its command ends, a fresh /proc, /tmp and /dev/shm its task's
  own (`JobRunner`), an empty /run, and of the jobs directory its own job directory only.
- **Its environment, and only it.** The step's env reaches the command after it became the
  job's user, never a process that runs as root (the wrapper's environment is fixed); a name
  or value that cannot be passed as one variable is refused.
- **Limits** (``setrlimit``, just before the command):
  CPU time, address space, open files and the largest file written (stdout and stderr
  included) per process; processes at once when it has a user of its own (the kernel counts
  them per user, so a task's parallel steps share that count). Each is the
  step's value when it asks for less than the settings' (`JobLimits`), else the settings'.
- **No network.** Both network policies of the Worker API, ``restricted`` and ``none``, mean
  no network (as the orchestrator's own nodes run ``restricted``): the command runs in a
  network namespace of its task's (no other task's job enters it) whose only interface,
  loopback, is down. As root, ``unshare(CLONE_NEWNET)`` makes it; otherwise a new user
  namespace makes it possible (``CLONE_NEWUSER``, mapping the engine's user onto itself).
  ``jobwrap`` makes them once per task (`sandbox._namespaces`) and enters them before the user is
  switched. Whether that works here is tried once, with util-linux ``unshare`` and ``true``;
  if it does not, every job is refused, with a finding saying why.
- **No image, no labels.** The local sandbox runs commands on its host, which has no labels:
  a step that names an `image`, or asks for `required_labels` (which only worker nodes
  have), is refused, never run somewhere it did not ask for (`step_unfit`; a task whose given
  steps ask for either is refused by StartWorkflow already).

A refused job never runs: its result is a failed one whose stderr is the reason, which the
verifier turns into the attempt's finding.
"""

from __future__ import annotations

import os
import resource
import secrets
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from workflow_engine.config import JOB_UID_BASE, JOB_UID_COUNT, JobLimits
from workflow_engine.domain.held import Held
from workflow_engine.domain.jobs import JobRequest, Limits
from workflow_engine.sandbox._files import SAFE_PATH
from workflow_engine.sandbox._users import JobUsers

log = structlog.get_logger(__name__)

NETWORK_POLICIES = ("restricted", "none")
#: The limits as ``jobwrap`` takes them: its name for each resource, and the unit of its value.
_SETRLIMITS = {
    "cpu_seconds": ("cpu", 1),
    "memory_mb": ("as", 1024 * 1024),
    "open_files": ("nofile", 1),
    "output_mb": ("fsize", 1024 * 1024),
    "processes": ("nproc", 1),
}
#: What a signal that ended a command says about its limits (exit status 128 + the signal).
_LIMIT_SIGNALS = {
    signal.SIGXCPU: "stopped at its CPU time limit",
    signal.SIGXFSZ: "stopped at its output limit (the largest file it may write)",
}
#: What a command's stderr says when a limit refused it something, and which limit that was.
_LIMIT_WORDS = (
    (("MemoryError", "Cannot allocate memory", "out of memory", "bad_alloc"), "memory"),
    (("Resource temporarily unavailable", "Cannot fork", "can't fork", "fork: retry"), "processes"),
    (("Too many open files",), "open files"),
    (("File too large",), "output"),
)
#: The ``resource`` limit behind each of ours, to cap ours at what this process may grant.
_RLIMITS = {
    "cpu_seconds": (resource.RLIMIT_CPU, 1),
    "memory_mb": (resource.RLIMIT_AS, 1024 * 1024),
    "open_files": (resource.RLIMIT_NOFILE, 1),
    "output_mb": (resource.RLIMIT_FSIZE, 1024 * 1024),
    "processes": (resource.RLIMIT_NPROC, 1),
}


def step_unfit(image: str, required_labels: Sequence[str]) -> tuple[str, str] | None:
    """Why the local sandbox never runs a step asking for this `image` or these labels, as
    (the step's field, the reason); None when neither stops it.

    `Confinement.grant` refuses such a job; `LocalSandboxWorker.unfit` says it earlier, for
    StartWorkflow (before anything is stored) and the `llm` planner.
    """
    if image:
        return "image", (
            f"the local sandbox runs commands on its own host and cannot run the image "
            f"{image[:200]!r}; leave `image` empty, or send the step to a worker node that runs "
            f"images"
        )
    if required_labels:
        return "required_labels", (
            f"the local sandbox has no labels, and the step requires "
            f"{', '.join(required_labels)[:200]}; leave `required_labels` empty, or run the "
            f"engine with worker nodes (WORKFLOW_ENGINE_WORKER=nodes)"
        )
    return None


@dataclass(frozen=True, slots=True)
class Grant:
    """How one job runs under ``jobwrap``: its namespaces (`isolation`), user and
    ``setrlimit`` values."""

    uid: int | None
    limits: dict[str, int]
    #: "net" (a network namespace; as root) or "userns" (a user namespace with one in it).
    isolation: str = "net"
    #: The host's directories the job may write in (jobwrap: the rest of the host read-only).
    writable: tuple[str, ...] = ()

    def rlimit_args(self) -> list[str]:
        """One ``RESOURCE=SOFT:HARD`` word per limit set, in setrlimit's units, then one
        ``writable=PATH`` per directory the job may write in: ``jobwrap``'s."""
        words = []
        for name, (resource_name, unit) in _SETRLIMITS.items():
            value = self.limits.get(name, 0)
            if value:
                # SIGXCPU at the soft CPU limit (what `explain` recognises), SIGKILL a second
                # later.
                hard = value + 1 if name == "cpu_seconds" else value
                words.append(f"{resource_name}={value * unit}:{hard * unit}")
        return words + [f"writable={path}" for path in self.writable]

    def describe(self) -> str:
        """The limits, as a finding quotes them."""
        shown = {
            "cpu_seconds": "CPU {} s",
            "memory_mb": "memory {} MiB",
            "open_files": "open files {}",
            "processes": "processes {}",
            "output_mb": "output {} MiB",
        }
        parts = [shown[k].format(v) for k, v in self.limits.items() if v]
        return ", ".join(parts) or "none"

    def explain(self, exit_status: int, stderr: str) -> str:
        """A note for a command that failed under these limits, naming the one it likely hit;
        "" when nothing says it hit one."""
        try:
            hit = _LIMIT_SIGNALS.get(signal.Signals(exit_status - 128))
        except ValueError:
            hit = None
        for words, limit in _LIMIT_WORDS:
            if hit is None and any(word in stderr for word in words):
                hit = f"its stderr says it was refused more {limit} than its limits allow"
        return f"{hit} (it ran with the limits {self.describe()})" if hit else ""


class Confinement:
    """Grants each local job what it may use, or refuses it (see the module docstring)."""

    def __init__(
        self,
        limits: JobLimits | None = None,
        *,
        uid_base: int = JOB_UID_BASE,
        uid_count: int = JOB_UID_COUNT,
        own_users: bool | None = None,
        writable_paths: tuple[str, ...] = (),
    ) -> None:
        """`own_users`: run each task's jobs as a user of its own (None: when this is root,
        the only way it can; False isolates them as a process that is not root would).
        `writable_paths`: the host's directories a job may write in; every other file of the
        host is read-only for it."""
        self._limits = limits or JobLimits()
        self._writable = writable_paths
        self._uid_base = uid_base
        self._uid_count = uid_count
        self._as_root = os.geteuid() == 0 if own_users is None else own_users
        # None until the first job tries it: "" when jobs can be isolated, else why not.
        self._isolation: str | None = None
        # Where the tasks' users are recorded: the runner's jobs directory (`keep_users_in`).
        self._users: JobUsers | None = None

    @property
    def writable_paths(self) -> tuple[str, ...]:
        """The host's directories its jobs may write in."""
        return self._writable

    def keep_users_in(self, jobs_dir: Path) -> None:
        """Record the tasks' users in `jobs_dir` (the runner's) from now on (`sandbox._users`)."""
        if self._as_root:
            self._users = JobUsers(jobs_dir, base=self._uid_base, count=self._uid_count)

    def release_idle_users(self, idle_seconds: float) -> int:
        """Free the user ids of tasks with no job started for `idle_seconds`."""
        return self._users.release_idle(idle_seconds) if self._users is not None else 0

    def grant(self, job: JobRequest) -> Grant | str:
        """What `job` runs with, or why it may not run here."""
        sandbox = job.sandbox
        unfit = step_unfit(sandbox.image, job.required_labels)
        if unfit:
            return f"refused: {unfit[1]}"
        if sandbox.network_policy not in NETWORK_POLICIES:
            return (
                f"refused: unknown network_policy {sandbox.network_policy[:64]!r}; "
                f"expected one of {', '.join(NETWORK_POLICIES)}"
            )
        unfit_env = next(
            (n for n, v in sandbox.env.items() if not n or "=" in n or "\0" in n + v), None
        )
        if unfit_env is not None:
            return f"refused: env {unfit_env[:64]!r} cannot be passed to a command as one variable"
        uid = None
        if self._as_root:
            uid = self._uid_for(job.workspace)
            if uid is None:
                return (
                    f"refused: every user id from {self._uid_base} to "
                    f"{self._uid_base + self._uid_count - 1} is taken by a task whose jobs may "
                    f"still run or be kept"
                )
        problem = self._isolate()
        if problem:
            return (
                f"refused: this worker cannot enforce network_policy "
                f"{sandbox.network_policy!r} (no network): {problem}"
            )
        return Grant(
            uid=uid,
            limits=self._limits_for(sandbox.limits, uid),
            isolation="net" if self._as_root else "userns",
            writable=self._writable,
        )

    def held(self) -> list[Held]:
        return self._users.held() if self._users is not None else []

    def _uid_for(self, workspace: str) -> int | None:
        """The recorded user of the job's task and run; without a runner's record (a
        `Confinement` used on its own), one drawn at random for this job alone."""
        if self._users is None:
            return self._uid_base + secrets.randbelow(self._uid_count)
        return self._users.for_task(workspace)

    def _limits_for(self, asked: Limits, uid: int | None) -> dict[str, int]:
        limits = {}
        for name in _RLIMITS:
            ceiling = getattr(self._limits, name)
            wanted = getattr(asked, name)
            value = min(wanted, ceiling) if wanted and ceiling else wanted or ceiling
            kind, unit = _RLIMITS[name]
            hard = resource.getrlimit(kind)[1]
            if hard != resource.RLIM_INFINITY and (not value or value * unit > hard):
                value = hard // unit  # more than this process may have is not ours to grant
            limits[name] = value
        if uid is None:
            # The kernel counts processes per user: without a user of its own, a job's count
            # would include the engine's processes and every other job's.
            limits["processes"] = 0
        return limits

    def _isolate(self) -> str:
        """Why a job cannot run here without network (and, as root, as another user); "" when
        it can. Tried once, with util-linux ``unshare``, which makes the namespaces jobwrap
        makes."""
        if self._isolation is None:
            self._isolation = self._try_isolation()
        return self._isolation

    def _try_isolation(self) -> str:
        unshare = shutil.which("unshare", path=SAFE_PATH)
        if unshare is None:
            return f"util-linux `unshare` is not on {SAFE_PATH}"
        if self._as_root:
            prefix: tuple[str, ...] = (unshare, "--net")
            trial = (*prefix, "--setuid", str(self._uid_base), "--setgid", str(self._uid_base))
            advice = (
                "(as root it needs CAP_SYS_ADMIN, and user ids from WORKFLOW_ENGINE_JOB_UID_BASE "
                "on, or WORKFLOW_ENGINE_NODE_JOB_UID_BASE on a worker node)"
            )
        else:
            prefix = (unshare, "--user", "--map-current-user", "--net")
            trial = prefix
            advice = "(run the engine as root, or allow unprivileged user namespaces)"
        try:
            done = subprocess.run(
                [*trial, "--", "true"],
                capture_output=True,
                timeout=10,
                env={"PATH": SAFE_PATH},
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = f"{' '.join(trial)} did not run: {exc} {advice}"
        else:
            if done.returncode == 0:
                log.info("sandbox_isolation", argv=list(prefix), as_root=self._as_root)
                return ""
            said = done.stderr.decode(errors="replace").strip()[-300:]
            problem = f"{' '.join(trial)} failed: {said or done.returncode} {advice}"
        log.warning("sandbox_isolation_unavailable", problem=problem)
        return problem
