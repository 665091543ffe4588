"""The local sandbox: runs a job as a confined local process, once per job id.

Shared by the engine's embedded worker (`capabilities.workers._local`) and `workflow-engine
worker-node`, which use it through what this package offers (`__all__`): the `JobRunner`, the
`Confinement` that decides what a job may use, and the names of a job directory's layout and
paths that a worker or verifier reads.

Internal (used only inside this package): `runner` starts and re-attaches jobs; `wrapper` is
the wrapper each job runs under (``jobwrap``, from ``jobwrap.c``), the check that it was built
(`require_jobwrap`, offered too: a worker node and the engine refuse to start without it) and
its spawn; `processes`
waits on, reaps and signals a wrapper; `retention` is what `JobRunner.prune` removes; `grant`
decides a job's user, limits and confinement (or refuses it); `users` allocates the job users;
`namespaces` keeps a task's network namespace; `files` is a job directory's layout; `at_fork`
closes the engine's ends in a forked child; `beneath` walks a path inside a job's directory
without following it out.
"""

from workflow_engine.sandbox._beneath import exists_beneath
from workflow_engine.sandbox._files import SAFE_PATH, TARGET, WORKER_NOTE
from workflow_engine.sandbox._grant import Confinement, Grant, step_unfit
from workflow_engine.sandbox._runner import JobRunner
from workflow_engine.sandbox._wrapper import require_jobwrap

__all__ = [
    "SAFE_PATH",
    "TARGET",
    "WORKER_NOTE",
    "Confinement",
    "Grant",
    "JobRunner",
    "exists_beneath",
    "require_jobwrap",
    "step_unfit",
]
