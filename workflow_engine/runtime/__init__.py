"""Live runs in this process: one asyncio task each, their heartbeats, and watch wake-ups.

What the engine and the service use (`__all__`): `RunManager` (the runs), `Run`, `EventHub`
(watch wake-ups), `Recoverer` (automatic recovery), `Pruner` and `prune_command` (retention),
`Scheduler` (schedules' slots), `DeadlineSweep` (approval deadlines), `Readiness` (health),
`Collector` (metrics of the runs), `Census` (what the engine holds) and `Quota` (a tenant's
cap). Their modules are internal.
"""

from workflow_engine.runtime._census import Census, remembered
from workflow_engine.runtime._collector import Collector
from workflow_engine.runtime._deadlines import DeadlineSweep
from workflow_engine.runtime._events import EventHub
from workflow_engine.runtime._manager import RunManager
from workflow_engine.runtime._quotas import Quota
from workflow_engine.runtime._readiness import Readiness
from workflow_engine.runtime._recovery import Recoverer
from workflow_engine.runtime._retention import Pruner, prune_command
from workflow_engine.runtime._run import Run
from workflow_engine.runtime._schedules import Scheduler

__all__ = [
    "Census",
    "Collector",
    "DeadlineSweep",
    "EventHub",
    "Pruner",
    "Quota",
    "Readiness",
    "Recoverer",
    "Run",
    "RunManager",
    "Scheduler",
    "prune_command",
    "remembered",
]
