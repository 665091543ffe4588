"""The local sandbox: runs a job as a confined local process, once per job id.

Shared by the engine's embedded worker (`capabilities.local_worker`) and `workflow-engine
worker-node`. `runner` starts and re-attaches jobs; `grant` decides a job's user, limits and
confinement (or refuses it); `users` allocates the job users; `namespaces` keeps a task's network
namespace; `files` is a job directory's layout; `at_fork` closes the engine's ends in a forked
child; `beneath` walks a path inside a job's directory without following it out; `jobwrap.c` is the
small wrapper each job runs under.
"""
