"""The nodes of the workflow graph (`node_functions` names them, in graph order).

Each node reads the state, calls one capability, and returns the keys it changes. Every node is
safe to run again: a node that was running when the process died runs again on resume, so
`dispatch_step` only *records* a job (with an id fixed by task, step and attempt) and
`collect_result` runs it through a worker that never runs one job id twice.

One module a phase: `planning`, `dispatching`, `collecting`, `verifying`, `finishing`; what
they share is in `base`.
"""

from __future__ import annotations

from typing import Any

from workflow_engine.graph._nodes.base import JOB_NAMESPACE, NodeBase, is_control, job_id_for
from workflow_engine.graph._nodes.collecting import Collecting
from workflow_engine.graph._nodes.dispatching import Dispatching, jobs_in_flight
from workflow_engine.graph._nodes.finishing import Finishing
from workflow_engine.graph._nodes.planning import Planning
from workflow_engine.graph._nodes.verifying import Verifying

__all__ = [
    "JOB_NAMESPACE",
    "Nodes",
    "is_control",
    "job_id_for",
    "jobs_in_flight",
    "node_functions",
]


class Nodes(Planning, Dispatching, Collecting, Verifying, Finishing, NodeBase):
    """The node functions, bound to their capabilities."""


def node_functions(nodes: Nodes) -> dict[str, Any]:
    """Node name to bound function, in graph order."""
    return {
        "load_task_context": nodes.load_task_context,
        "plan_steps": nodes.plan_steps,
        "dispatch_step": nodes.dispatch_step,
        "collect_result": nodes.collect_result,
        "verify_step_result": nodes.verify_step_result,
        "finalize_summary": nodes.finalize_summary,
        "mark_failed": nodes.mark_failed,
        "suspend_workflow": nodes.suspend_workflow,
    }
