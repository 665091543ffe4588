"""Dispatch: record a job for every step that may start (`dispatch_step`), or ask for an
approval first.
"""

from __future__ import annotations

import structlog

from workflow_engine.capabilities.tasks import node_preferences
from workflow_engine.domain.deadlines import approval_expiry, effective_timeout
from workflow_engine.domain.jobs import Finding, JobRequest, Sandbox, Verification
from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.domain.task import LOADER_PROBLEM, Step, loader_variables
from workflow_engine.domain.values import JsonObject
from workflow_engine.graph import routing
from workflow_engine.graph._nodes.base import (
    NodeBase,
    is_control,
    job_id_for,
    step_of,
    steps_copy,
    worker_error_result,
)
from workflow_engine.graph.state import (
    JobResultRecord,
    PendingApproval,
    StepState,
    VerificationRecord,
    WorkflowState,
    as_record,
)

log = structlog.get_logger(__name__)


class Dispatching(NodeBase):
    """Chooses the steps that start, and records their jobs before anything runs."""

    async def dispatch_step(self, state: WorkflowState) -> WorkflowState:
        """Record a job for every step that may start now, before anything runs.

        Bounded by the task's `max_parallel_steps` and its budget. A step that requires approval
        and has none pauses the workflow instead, once nothing else is in flight.
        """
        steps = steps_copy(state)
        flying = routing.in_flight(state)
        room = int(state.get("max_parallel_steps") or 1) - len(flying)
        approvals = state.get("approvals", {})
        now = self._clock.now()
        dispatches = int(state.get("dispatches", 0))
        update: WorkflowState = {}
        dispatched: list[str] = []
        for step_id in routing.ready(state):
            step = step_of(state, step_id)
            if refused := loader_variables(step.env):
                steps[step_id] = _refused_env(steps[step_id], step.id, refused)
                continue
            if step.requires_approval and step_id not in approvals:
                if not flying and not dispatched:
                    return approval_request(state, step, now)
                continue  # asked for once the steps in flight are done
            if room <= 0 or routing.budget_exhausted(state, now, step_id, dispatches):
                break
            steps[step_id] = await self._job_for(state, step, steps[step_id])
            dispatched.append(step_id)
            dispatches += 1
            room -= 1
            update["current_job"] = steps[step_id]["job"]
        attempts = dict(state.get("attempts_by_step", {}))
        attempts.update({sid: steps[sid]["attempts"] for sid in dispatched})
        update.update({"steps": steps, "dispatches": dispatches, "attempts_by_step": attempts})
        return update

    async def _job_for(self, state: WorkflowState, step: Step, previous: StepState) -> StepState:
        attempt = int(previous.get("attempts", 0)) + 1
        verification = previous.get("verification") or {}
        remediation: tuple[str, ...] = ()
        if attempt > 1 and verification.get("status") == "fail":
            remediation = tuple(verification.get("recommended_actions") or ())
        job = JobRequest(
            task_id=state["task_id"],
            job_id=job_id_for(state["task_id"], step.id, attempt, state.get("run_id", "")),
            run_id=state.get("run_id", ""),
            sandbox=Sandbox(
                command=step.command,
                env=step.env,
                timeout_seconds=step.timeout_seconds,
                image=step.image,
                limits=step.limits,
            ),
            attempt=attempt,
            step_id=step.id,
            remediation=remediation,
            context=tuple(await self._context_for(state, step)),
            required_labels=step.required_labels,
            preferred_labels=node_preferences(state.get("preferences_effective") or {}),
        )
        try:
            target = await self._caps.worker.select_target(job)
        except Exception as exc:
            if is_control(exc):
                raise
            log.warning("select_target_failed", step_id=step.id, error=repr(exc))
            # Verified as a failure, then retried.
            failed = worker_error_result(job, exc, self._masking(state))
            return {
                **previous,
                "status": "collected",
                "attempts": attempt,
                "result": as_record(JobResultRecord, failed),
                "job": {"target": "", "request": job.to_json()},
            }
        return {
            **previous,
            "status": "dispatched",
            "attempts": attempt,
            "job": {"target": target, "request": job.to_json()},
            "result": None,
        }

    async def _context_for(self, state: WorkflowState, step: Step) -> list[JsonObject]:
        """The outputs of the steps `step` depends on (of every earlier step, in order)."""
        steps = routing.plan_steps(state)
        context = state.get("context", {})
        if step.depends_on:
            wanted: list[str] = list(step.depends_on)
        else:
            ids = [s["id"] for s in steps]
            wanted = ids[: ids.index(step.id)] if not routing.is_graph(steps) else []
        entries = [context[sid] for sid in wanted if sid in context]
        if not entries:
            return []
        return await self._caps.compressor.compress(
            [dict(entry) for entry in entries], self._caps.context_budget_chars
        )


def _refused_env(previous: StepState, step_id: str, names: list[str]) -> StepState:
    """A step whose env sets the loader's variables (stored by an earlier version, which did
    not refuse them): failed with a finding, and nothing dispatched."""
    detail = (
        f"step {step_id} was not run: its env sets {', '.join(names)}, which "
        + LOADER_PROBLEM.removeprefix("is ")
    )
    finding = Finding(check="env", passed=False, detail=detail)
    verification = Verification(status="fail", findings=(finding,))
    return {
        **previous,
        "status": "failed",
        "error": detail,
        "verification": as_record(VerificationRecord, verification),
    }


def approval_request(state: WorkflowState, step: Step, now: float) -> WorkflowState:
    reason = f"step {step.id} requires approval before it runs"
    # A model-planned step: say which rule of the command policy asked for the approval.
    if policy := routing.step_state(state, step.id).get("approval_policy"):
        reason += f" ({policy}; the model planned it)"
    pending: PendingApproval = {
        "step_id": step.id,
        "description": step.description,
        "command": list(step.command),
        "env": dict(step.env),
        "reason": reason,
        "requested_at": now,
        **_expiry_fields(state, step, now),
    }
    return {
        "status": WorkflowStatus.WAITING_FOR_APPROVAL.in_state,
        "pending_approval": pending,
        "wait_expired": None,
    }


def _expiry_fields(state: WorkflowState, step: Step, now: float) -> PendingApproval:
    """When a request made at `now` for `step` expires, and what happens then: the step's
    approval timeout (else the task's), or the workflow's deadline if that comes first."""
    seconds, action = effective_timeout(
        step.approval_timeout_seconds,
        step.on_approval_timeout,
        int(state.get("approval_timeout_seconds") or 0),
        state.get("on_approval_timeout"),
    )
    fields: PendingApproval = {"timeout_seconds": seconds, "timeout_action": action}
    expiry = approval_expiry(
        requested_at=now,
        timeout_seconds=seconds,
        action=action,
        started_at=state.get("started_at"),
        deadline_seconds=int((state.get("budget") or {}).get("deadline_seconds") or 0),
    )
    if expiry is not None:
        fields["expires_at"] = expiry.at
        fields["on_timeout"] = expiry.action
    return fields


def jobs_in_flight(state: WorkflowState) -> list[tuple[str, JobRequest]]:
    """The (target, request) of every job the state records as dispatched and not collected."""
    jobs = []
    for sid in routing.in_flight(state):
        step = routing.step_state(state, sid)
        job = step.get("job") or {}
        if step["status"] == "dispatched" and job.get("request"):
            jobs.append((str(job.get("target", "")), JobRequest.from_json(job["request"])))
    return jobs
