"""Where the graph goes next. Pure functions of the state, so they are tested on their own."""

from __future__ import annotations

from typing import Literal

from workflow_engine.graph.state import WorkflowState

AfterPlan = Literal["dispatch_step", "finalize_summary", "mark_failed"]
AfterVerify = Literal["dispatch_step", "finalize_summary", "mark_failed"]


def after_plan(state: WorkflowState) -> AfterPlan:
    """An empty plan cannot satisfy the task: fail rather than claim success."""
    if state.get("error"):
        return "mark_failed"
    if not state.get("plan", {}).get("steps"):
        return "mark_failed"
    return "dispatch_step"


def after_verify(state: WorkflowState) -> AfterVerify:
    """Next step on pass, same step again while attempts remain, else fail.

    `verify_step_result` has already advanced `current_step_index` on a pass, so a pass with
    no step left means the plan is done.
    """
    steps = state.get("plan", {}).get("steps", [])
    verification = state.get("verification") or {}
    if verification.get("status") == "pass":
        if state.get("current_step_index", 0) >= len(steps):
            return "finalize_summary"
        return "dispatch_step"
    step_id = steps[state.get("current_step_index", 0)]["id"]
    attempts = state.get("attempts_by_step", {}).get(step_id, 0)
    if attempts < state.get("max_attempts_per_step", 1):
        return "dispatch_step"
    return "mark_failed"
