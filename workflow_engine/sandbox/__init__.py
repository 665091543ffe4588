"""The local sandbox: runs a job as a confined local process, once per job id.

Shared by the engine's embedded worker (`capabilities.workers._local`) and `workflow-engine
worker-node`, which use it through what this package offers (`__all__`): the `JobRunner`, the
`Confinement` that decides what a job may use, `require_jobwrap` (the engine and a worker node
refuse to start without the wrapper), and the names of a job directory's layout and paths that
a worker or verifier reads.

Its own modules: `_runner` starts and re-attaches jobs; `_wrapper` is the wrapper each job runs
under (``jobwrap``, from ``jobwrap.c``) and its spawn; `_processes` waits on, reaps and signals
a wrapper; `_retention` is what `JobRunner.prune` removes; `_grant` decides a job's user, limits
and confinement (or refuses it); `_users` allocates the job users; `_namespaces` keeps a task's
network namespace; `_files` is a job directory's layout; `_at_fork` closes the engine's ends in
a forked child; `_beneath` walks a path inside a job's directory without following it out.
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
