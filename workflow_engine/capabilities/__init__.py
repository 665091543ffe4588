"""What the graph's nodes call, behind narrow interfaces, and the factory that builds them.

`protocols` holds the interfaces (task source, planner, worker, verifier, context compressor)
and the values that cross them; `factory` builds the implementations the settings name. The
implementations are grouped by what they talk to:

- `tasks`: where a task comes from (StartWorkflow's own, the orchestrator's table, MCP);
- `model`: a model over an OpenAI-compatible endpoint (planner, verifier, command policy);
- `nodes`: worker nodes over the Worker API (registry, nodes file or table, the HTTP worker);
- at this level, the embedded ones: `embedded_planner`, `embedded_verifier`, `job_verifier`,
  `local_worker` (the local sandbox, `workflow_engine.sandbox`), `simulated_worker`, and
  `job_tracker`, which runs a workflow's dispatched jobs at the same time.

What the engine, the graph and the worker node use (`__all__`): the factory's
`build_capabilities` and the `Capabilities` it returns, the `JobTracker`, the protocols they
call through, and `LocalSandboxWorker`. The implementations' modules are internal: the factory
is how they are chosen.
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
from workflow_engine.capabilities.workers._local import LocalSandboxWorker

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
