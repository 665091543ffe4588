"""The first phase: read the task (`load_task_context`) and plan its steps (`plan_steps`)."""

from __future__ import annotations

import structlog
from pydantic import ValidationError

from workflow_engine.capabilities.model import PolicedPlan, recording
from workflow_engine.capabilities.tasks import merge_preferences
from workflow_engine.domain.jobs import Finding, Verification
from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.domain.values import as_invalid_argument
from workflow_engine.errors import InvalidArgument, WorkflowEngineError
from workflow_engine.graph._nodes.base import NodeBase, accounted, approval_policy, is_control
from workflow_engine.graph.state import (
    BudgetRecord,
    PlanRecord,
    VerificationRecord,
    WorkflowState,
    as_record,
)

log = structlog.get_logger(__name__)


class Planning(NodeBase):
    """Reads the task and has the planner turn it into steps."""

    async def load_task_context(self, state: WorkflowState) -> WorkflowState:
        """Read the task as stored at start; cache its criteria, preferences, limits in state."""
        task = await self._caps.stored_tasks.load(state["task_id"])
        return {
            "status": WorkflowStatus.RUNNING.in_state,
            "prompt": task.prompt,
            "acceptance_criteria": [c.to_json() for c in task.acceptance_criteria],
            "preferences_effective": merge_preferences(task.preferences),
            "metadata": task.metadata.to_json(),
            "max_attempts_per_step": task.max_attempts_per_step,
            "max_parallel_steps": task.max_parallel_steps,
            "budget": as_record(BudgetRecord, task.budget),
            "started_at": state.get("started_at") or self._clock.now(),
            "approval_timeout_seconds": task.approval_timeout_seconds,
            "on_approval_timeout": task.on_approval_timeout,
        }

    async def plan_steps(self, state: WorkflowState) -> WorkflowState:
        """Turn the task into executable steps; a plan that cannot run is an error."""
        with recording() as ledger:
            update = await self._plan(state)
        return accounted(state, update, ledger, "plan_steps")

    async def _plan(self, state: WorkflowState) -> WorkflowState:
        task = await self._caps.stored_tasks.load(state["task_id"])
        try:
            plan = await self._caps.planner.plan(task)
        except InvalidArgument as exc:
            return {"error": f"planner produced an invalid plan: {exc.message}"}
        except ValidationError as exc:
            invalid = as_invalid_argument(exc, "plan")
            return {"error": f"planner produced an invalid plan: {invalid.message}"}
        except WorkflowEngineError as exc:  # the model's own failure, or a refused command
            log.warning("planner_failed", error=exc.message)
            finding = Finding(check="planner", passed=False, detail=exc.message)
            verdict = Verification(status="fail", findings=(finding,))
            return {
                "error": f"planner failed: {exc.message}",
                "verification": as_record(VerificationRecord, verdict),
            }
        except Exception as exc:
            if is_control(exc):
                raise
            log.warning("planner_failed", error=repr(exc))
            return {"error": f"planner failed: {self._masking(state).masked_repr(exc)}"}
        policy = plan.policy if isinstance(plan, PolicedPlan) else {}
        update: WorkflowState = {
            "plan": as_record(PlanRecord, plan),
            "current_step_index": 0,
            "attempts_by_step": {},
            "steps": {
                s.id: {"status": "pending", "attempts": 0, **approval_policy(policy.get(s.id))}
                for s in plan.steps
            },
        }
        if not plan.steps:
            update["error"] = "planner produced no steps: " + "; ".join(plan.assumptions)
        return update
