"""What the graph's nodes call, behind narrow interfaces, and the factory that builds them.

`_protocols` holds the interfaces (task source, planner, worker, verifier, context compressor)
and the values that cross them; `_factory` builds the implementations the settings name. The
implementations are grouped by what they talk to, each subpackage with its own face:

- `tasks`: where a task comes from (StartWorkflow's own, the orchestrator's table, MCP);
- `model`: a model over an OpenAI-compatible endpoint (planner, verifier, command policy);
- `workers`: where a job runs (the local sandbox, worker nodes over the Worker API, the
  simulated worker);
- at this level: `_static_planner` (the plan the task gives), `_machine_verifier` (checks a
  machine can make), `_job_verifier` (a verifier that is itself a job), `_compressor` (the
  context a step's job is given), and `_job_tracker` with `_fair_slots`, which run a
  workflow's dispatched jobs at the same time, fairly across tenants.

What the engine, the graph, the service and the worker node use (`__all__`): the factory's
`build_capabilities` and the `Capabilities` it returns, the `JobTracker`, the protocols they
call through, and `LocalSandboxWorker`.
"""

from workflow_engine.capabilities._factory import (
    Capabilities,
    Lent,
    build_capabilities,
    check_choices,
    opened,
)
from workflow_engine.capabilities._job_tracker import JobTracker
from workflow_engine.capabilities._protocols import (
    ContextCompressor,
    Planner,
    RevisingPlanner,
    TaskSource,
    Verifier,
    Worker,
)
from workflow_engine.capabilities.workers import LocalSandboxWorker

__all__ = [
    "Capabilities",
    "ContextCompressor",
    "JobTracker",
    "Lent",
    "LocalSandboxWorker",
    "Planner",
    "RevisingPlanner",
    "TaskSource",
    "Verifier",
    "Worker",
    "build_capabilities",
    "check_choices",
    "opened",
]
