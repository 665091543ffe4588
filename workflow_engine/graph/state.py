"""The workflow's state: what every node reads and writes, and what the checkpoint stores.

All values are JSON (the `state` column of `workflow_checkpoints`). The first eight keys are the
orchestrator's state model; the rest are the engine's own.
"""

from __future__ import annotations

from typing import TypedDict

from workflow_engine.spec import JsonObject


class WorkflowState(TypedDict, total=False):
    # The orchestrator's state model.
    task_id: str
    acceptance_criteria: list[JsonObject]
    preferences_effective: JsonObject
    plan: JsonObject  # {"steps": [...], "assumptions": [...]}
    current_step_index: int
    attempts_by_step: dict[str, int]
    last_result: JsonObject | None
    verification: JsonObject | None  # {"status", "findings", "recommended_actions"}
    # The engine's additions.
    status: str  # running | succeeded | failed
    prompt: str
    metadata: JsonObject
    max_attempts_per_step: int
    current_job: JsonObject | None  # the job dispatched for the current attempt
    results: list[JsonObject]  # one record per step that passed
    summary: str
    error: str


STATE_KEYS: frozenset[str] = frozenset(WorkflowState.__annotations__)


def initial_state(task_id: str) -> WorkflowState:
    """The state a workflow starts from, before `load_task_context` fills it in."""
    return {
        "task_id": task_id,
        "status": "running",
        "acceptance_criteria": [],
        "preferences_effective": {},
        "plan": {"steps": [], "assumptions": []},
        "current_step_index": 0,
        "attempts_by_step": {},
        "last_result": None,
        "verification": None,
        "current_job": None,
        "results": [],
        "summary": "",
        "error": "",
    }
