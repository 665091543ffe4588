"""Live runs in this process: one asyncio task each, their heartbeats, and watch wake-ups.

What the engine uses (`__all__`): `RunManager` (the runs), `Run`, `EventHub` (watch wake-ups),
`Recoverer` (automatic recovery), `Pruner` (retention), `Readiness` (health), `Collector`
(metrics of the runs) and `Quota` (a tenant's cap). Their modules are internal.
"""

from workflow_engine.runtime._collector import Collector
from workflow_engine.runtime._events import EventHub
from workflow_engine.runtime._manager import RunManager
from workflow_engine.runtime._quotas import Quota
from workflow_engine.runtime._readiness import Readiness
from workflow_engine.runtime._recovery import Recoverer
from workflow_engine.runtime._retention import Pruner
from workflow_engine.runtime._run import Run

__all__ = [
    "Collector",
    "EventHub",
    "Pruner",
    "Quota",
    "Readiness",
    "Recoverer",
    "Run",
    "RunManager",
]
