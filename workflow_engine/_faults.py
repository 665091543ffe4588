"""Fault injection for the fault suite (`make chaos`); inert unless configured.

`WORKFLOW_ENGINE_FAULTS` is a comma-separated list of ``<action>:<point>:<node>[#<n>]``:

- action ``kill`` sends this process SIGKILL (no drain, nothing flushed);
  action ``dberror`` raises a connection-class database error once (retried like a real one);
- point ``before`` is after the node's work but before its checkpoint is written (the most
  dangerous moment to die), ``after`` is right after the checkpoint committed, and ``renew``
  is a lease renewal (node is ignored: use ``*``);
- ``#<n>`` picks the n-th time the node completes in this process (default the first).

Example: ``kill:before:collect_result#2,dberror:after:plan_steps``. Never set in production.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from dataclasses import dataclass, field

import psycopg
import structlog

from workflow_engine.errors import ConfigError

log = structlog.get_logger(__name__)

ACTIONS = ("kill", "dberror")
POINTS = ("before", "after", "renew")


class InjectedDatabaseError(psycopg.OperationalError):
    """A fault that looks like a dropped connection (no SQLSTATE): transient, retried."""


@dataclass(frozen=True, slots=True)
class Fault:
    action: str
    point: str
    node: str
    occurrence: int


@dataclass
class FaultPlan:
    """Faults to inject, and how often each node has been seen so far in this process."""

    faults: tuple[Fault, ...] = ()
    _seen: Counter[tuple[str, str]] = field(default_factory=Counter)
    _fired: set[Fault] = field(default_factory=set)

    @classmethod
    def parse(cls, spec: str) -> FaultPlan:
        faults = []
        for item in filter(None, (part.strip() for part in spec.split(","))):
            try:
                action, point, target = item.split(":")
                node, _, nth = target.partition("#")
                fault = Fault(action, point, node, int(nth or 1))
            except ValueError:
                raise ConfigError(f"WORKFLOW_ENGINE_FAULTS: cannot parse {item!r}") from None
            if action not in ACTIONS or point not in POINTS:
                raise ConfigError(f"WORKFLOW_ENGINE_FAULTS: unknown action or point in {item!r}")
            faults.append(fault)
        return cls(tuple(faults))

    def __bool__(self) -> bool:
        return bool(self.faults)

    @property
    def fired(self) -> int:
        """How many of the planned faults have been injected so far."""
        return len(self._fired)

    def at(self, point: str, node: str) -> None:
        """Called at each fault point; fires the matching fault, if any."""
        if not self.faults:
            return
        self._seen[(point, node)] += 1
        count = self._seen[(point, node)]
        for fault in self.faults:
            if fault in self._fired or fault.point != point:
                continue
            if fault.node not in (node, "*") or fault.occurrence != count:
                continue
            self._fired.add(fault)
            log.warning("fault_injected", action=fault.action, point=point, node=node)
            if fault.action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise InjectedDatabaseError(f"injected fault at {point} {node}")
