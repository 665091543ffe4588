"""What one engine instance owns and hands down: its clock, secrets, metrics and fault plan.

The `Engine` builds one `EngineContext` (`for_settings`) and gives it to what it builds: the
capabilities (through `Lent`), the runs, the checkpointer, the service and the API. Nothing of
it is a module global, so two engines in one process share no secret, no counter and no
fault; a test builds a context of its own the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workflow_engine._clock import Clock, SystemClock
from workflow_engine._faults import FaultPlan
from workflow_engine._masking import EngineSecrets
from workflow_engine.config import Settings
from workflow_engine.telemetry import Metrics


@dataclass(frozen=True, slots=True)
class EngineContext:
    """One engine's clock, secrets (for its logs, errors and answers), metrics and injected
    faults."""

    #: The time every timed rule reads (see `workflow_engine._clock`).
    clock: Clock = field(default_factory=SystemClock)

    secrets: EngineSecrets = field(default_factory=EngineSecrets)
    #: Off unless `Settings.metrics_listen` is set (the engine enables them as it starts).
    metrics: Metrics = field(default_factory=Metrics)
    #: Empty unless `Settings.faults` names some (the fault suite only).
    faults: FaultPlan = field(default_factory=FaultPlan)

    def __post_init__(self) -> None:
        self.metrics.clock = self.clock  # the durations it reports are on the engine's clock

    @classmethod
    def for_settings(cls, settings: Settings) -> EngineContext:
        """A new context for an engine of `settings`: its fault plan parsed, the credentials
        the settings hold remembered (others are, as they are read: the model's key, the
        callers' tokens, the nodes')."""
        context = cls(faults=FaultPlan.parse(settings.faults))
        context.secrets.add_credentials([settings.mcp.bearer_token, settings.node.token])
        return context
