"""The seven nodes of the workflow graph.

Each node reads the state, calls one capability, and returns the keys it changes. Every node is
safe to run again: a node that was running when the process died runs again on resume, so
`dispatch_step` only *records* a job (with an id fixed by task, step and attempt) and
`collect_result` runs it through a worker that never runs one job id twice.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import structlog

from workflow_engine.capabilities.base import (
    JobRequest,
    JobResult,
    Planner,
    TaskSource,
    Verifier,
    Worker,
)
from workflow_engine.capabilities.preferences import merge_preferences
from workflow_engine.errors import InvalidArgument, WorkflowEngineError
from workflow_engine.graph.state import WorkflowState
from workflow_engine.spec import AcceptanceCriterion, Step, validate_steps

log = structlog.get_logger(__name__)

#: Namespace of job ids: uuid5(JOB_NAMESPACE, "<task_id>/<step_id>/<attempt>").
JOB_NAMESPACE = uuid.UUID("5b0d7d0e-8f3c-4f7e-9a57-0e1f6c8a2b11")


def job_id_for(task_id: str, step_id: str, attempt: int) -> str:
    """The deterministic job id of one attempt at one step."""
    return str(uuid.uuid5(JOB_NAMESPACE, f"{task_id}/{step_id}/{attempt}"))


@dataclass(frozen=True, slots=True)
class Capabilities:
    """The capability each node calls; see `workflow_engine.capabilities`."""

    task_source: TaskSource
    planner: Planner
    worker: Worker
    verifier: Verifier


def _is_control(exc: BaseException) -> bool:
    """Errors that must stop the run rather than be recorded as the task's failure."""
    return isinstance(exc, WorkflowEngineError | psycopg.Error)


class Nodes:
    """The node functions, bound to their capabilities."""

    def __init__(self, capabilities: Capabilities) -> None:
        self._caps = capabilities

    async def load_task_context(self, state: WorkflowState) -> WorkflowState:
        """Read the task and cache its criteria and effective preferences in the state."""
        task = await self._caps.task_source.load(state["task_id"])
        return {
            "status": "running",
            "prompt": task.prompt,
            "acceptance_criteria": [c.to_json() for c in task.acceptance_criteria],
            "preferences_effective": merge_preferences(task.preferences),
            "metadata": task.metadata.to_json(),
            "max_attempts_per_step": task.max_attempts_per_step,
        }

    async def plan_steps(self, state: WorkflowState) -> WorkflowState:
        """Turn the task into executable steps; a plan that cannot run is an error."""
        task = await self._caps.task_source.load(state["task_id"])
        try:
            plan = await self._caps.planner.plan(task)
            validate_steps(plan.steps, prefix="plan.steps")
        except InvalidArgument as exc:
            return {"error": f"planner produced an invalid plan: {exc.message}"}
        except Exception as exc:
            if _is_control(exc):
                raise
            log.warning("planner_failed", error=repr(exc))
            return {"error": f"planner failed: {exc!r}"}
        update: WorkflowState = {
            "plan": plan.to_json(),
            "current_step_index": 0,
            "attempts_by_step": {},
        }
        if not plan.steps:
            update["error"] = "planner produced no steps: " + "; ".join(plan.assumptions)
        return update

    async def dispatch_step(self, state: WorkflowState) -> WorkflowState:
        """Choose a target and record the next attempt's job, before anything runs."""
        step = _current_step(state)
        attempt = state.get("attempts_by_step", {}).get(step.id, 0) + 1
        verification = state.get("verification") or {}
        remediation: tuple[str, ...] = ()
        if attempt > 1 and verification.get("status") == "fail":
            remediation = tuple(verification.get("recommended_actions") or ())
        job = JobRequest(
            task_id=state["task_id"],
            job_id=job_id_for(state["task_id"], step.id, attempt),
            command=step.command,
            env=step.env,
            timeout_seconds=step.timeout_seconds,
            image=step.image,
            attempt=attempt,
            step_id=step.id,
            remediation=remediation,
        )
        target = await self._caps.worker.select_target(job)
        attempts = dict(state.get("attempts_by_step", {}))
        attempts[step.id] = attempt
        return {
            "attempts_by_step": attempts,
            "current_job": {"target": target, "request": job.to_json()},
        }

    async def collect_result(self, state: WorkflowState) -> WorkflowState:
        """Run (or re-attach to) the recorded job and keep its normalised result."""
        current = state.get("current_job") or {}
        job = JobRequest.from_json(current["request"])
        try:
            result = await self._caps.worker.run(str(current.get("target", "")), job)
        except Exception as exc:
            if _is_control(exc):
                raise
            log.warning("worker_failed", job_id=job.job_id, error=repr(exc))
            result = _worker_error_result(job, exc)
        return {"last_result": result.to_json()}

    async def verify_step_result(self, state: WorkflowState) -> WorkflowState:
        """Judge the result; on a pass record it and move to the next step."""
        step = _current_step(state)
        index = state.get("current_step_index", 0)
        is_last = index == len(state["plan"]["steps"]) - 1
        criteria = (
            [AcceptanceCriterion.from_json(c) for c in state.get("acceptance_criteria", [])]
            if is_last
            else []
        )
        result = JobResult.from_json(state.get("last_result") or {})
        verification = await self._caps.verifier.verify(step, result, criteria)
        update: WorkflowState = {"verification": verification.to_json()}
        if verification.status == "pass":
            record = {
                "step_id": step.id,
                "attempt": state.get("attempts_by_step", {}).get(step.id, 1),
                "job_id": result.job_id,
                "status": result.status,
                "exit_code": result.exit_code,
                "stdout": result.stdout[-2000:],
                "work_dir": result.work_dir,
                "ended_at": result.ended_at,
            }
            update["results"] = [*state.get("results", []), record]
            update["current_step_index"] = index + 1
        return update

    async def finalize_summary(self, state: WorkflowState) -> WorkflowState:
        """Write the final summary: every step, its attempts, and where its output is."""
        results = state.get("results", [])
        lines = [f"All {len(results)} step(s) passed verification."]
        for r in results:
            lines.append(
                f"- {r['step_id']}: attempt {r['attempt']}, exit {r['exit_code']}, "
                f"job {r['job_id']}" + (f", work dir {r['work_dir']}" if r.get("work_dir") else "")
            )
        return {"status": "succeeded", "summary": "\n".join(lines)}

    async def mark_failed(self, state: WorkflowState) -> WorkflowState:
        """Record the failure with the final verification findings."""
        error = state.get("error") or ""
        if not error:
            step = _current_step(state)
            attempts = state.get("attempts_by_step", {}).get(step.id, 0)
            failed = [
                f["detail"]
                for f in (state.get("verification") or {}).get("findings", [])
                if not f.get("passed")
            ]
            error = f"step {step.id} failed after {attempts} attempt(s): " + "; ".join(failed)
        return {"status": "failed", "error": error, "summary": error}


def _current_step(state: WorkflowState) -> Step:
    return Step.from_json(state["plan"]["steps"][state.get("current_step_index", 0)])


def _worker_error_result(job: JobRequest, exc: Exception) -> JobResult:
    now = datetime.now(UTC).isoformat()
    return JobResult(
        task_id=job.task_id,
        job_id=job.job_id,
        status="failed",
        exit_code=None,
        stdout="",
        stderr=f"worker error: {exc!r}",
        started_at=now,
        ended_at=now,
    )


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
    }
