"""Verify: judge each collected result (`verify_step_result`); retry a failed step, revised by
the planner when it can, while attempts remain.
"""

from __future__ import annotations

import structlog

from workflow_engine._masking import state_secrets
from workflow_engine.capabilities import RevisingPlanner
from workflow_engine.capabilities.model import PolicyDecision, policy_note, recording
from workflow_engine.domain.jobs import Finding, JobResult, Verification
from workflow_engine.domain.task import AcceptanceCriterion, Step
from workflow_engine.errors import PlanRefused, WorkflowEngineError
from workflow_engine.graph import routing
from workflow_engine.graph._nodes.base import (
    NodeBase,
    accounted,
    approval_policy,
    is_control,
    step_of,
    steps_copy,
)
from workflow_engine.graph.state import (
    PlanRecord,
    ResultRecord,
    RevisionRecord,
    StepStatus,
    VerificationRecord,
    WorkflowState,
    as_record,
)

log = structlog.get_logger(__name__)


MAX_CONTEXT_OUTPUT = 4000


class Verifying(NodeBase):
    """Judges results, and decides each step's next status."""

    async def verify_step_result(self, state: WorkflowState) -> WorkflowState:
        """Judge every collected result: a pass records it, a fail is retried while attempts
        remain (with the step revised by the planner, when configured) and fails the step when
        none do."""
        with recording() as ledger:
            update = await self._verify_all(state)
        return accounted(state, update, ledger, "verify_step_result")

    async def _verify_all(self, state: WorkflowState) -> WorkflowState:
        steps = steps_copy(state)
        plan = routing.plan_steps(state)
        final_id = plan[-1]["id"] if plan else ""
        results = list(state.get("results", []))
        context = dict(state.get("context", {}))
        update: WorkflowState = {}
        for sid in [s["id"] for s in plan if steps[s["id"]]["status"] == "collected"]:
            step = step_of(state, sid)
            result = JobResult.from_json(steps[sid].get("result") or {})
            criteria = (
                [AcceptanceCriterion.from_json(c) for c in state.get("acceptance_criteria", [])]
                if sid == final_id
                else []
            )
            verification = await self._verify(state, step, result, criteria)
            attempts = int(steps[sid].get("attempts", 1))
            error = ""
            if verification.status == "pass":
                status: StepStatus = "passed"
                results.append(_result_record(sid, attempts, result))
                context[sid] = {
                    "step_id": sid,
                    "exit_code": result.exit_code,
                    "output": result.stdout[-MAX_CONTEXT_OUTPUT:],
                }
            elif attempts < int(state.get("max_attempts_per_step", 1)):
                status = "pending"
                error, decision = await self._revise(
                    state, update, step, attempts, result, verification
                )
                if error:
                    status = "failed"
                steps[sid] = {**steps[sid], **approval_policy(decision)}
            else:
                status = "failed"
            verdict = as_record(VerificationRecord, verification)
            steps[sid] = {**steps[sid], "status": status, "verification": verdict}
            if error:
                steps[sid]["error"] = error
            update["verification"] = verdict
        passed = [s["id"] for s in plan if steps[s["id"]]["status"] == "passed"]
        first_open = next((i for i, s in enumerate(plan) if s["id"] not in passed), len(plan))
        update.update(
            {
                "steps": steps,
                "results": results,
                "context": context,
                "current_step_index": first_open,
            }
        )
        return update

    async def _revise(
        self,
        state: WorkflowState,
        update: WorkflowState,
        step: Step,
        attempt: int,
        result: JobResult,
        verification: Verification,
    ) -> tuple[str, PolicyDecision | None]:
        """Have the planner revise `step` for its next attempt, recording the revision in
        `update` (the plan, `revisions`); the error that fails the step, or empty, and what the
        command policy decided about the revised step.

        A planner that cannot revise leaves the step as it was (the retry still gets the
        findings as remediation); a revision the command policy refuses fails the step.
        """
        planner = self._caps.planner
        if not self._caps.revise_steps or not isinstance(planner, RevisingPlanner):
            return "", None
        task = await self._caps.stored_tasks.load(state["task_id"])
        failed = "; ".join(f.detail for f in verification.findings if not f.passed)
        reason = self._masking(state).redact_part(failed, 1000)[0]  # masked before it is cut
        revisions = list(update.get("revisions", state.get("revisions", [])))
        record: RevisionRecord = {
            "step_id": step.id,
            "after_attempt": attempt,
            "reason": reason,
            "command_before": list(step.command),
        }
        try:
            revised, decision = await planner.revise(task, step, result, verification)
        except WorkflowEngineError as exc:
            record["error"] = exc.message
            update["revisions"] = [*revisions, record]
            if isinstance(exc, PlanRefused):
                return f"revision refused: {exc.message}", None
            log.warning("revision_failed", step_id=step.id, error=exc.message)
            return "", None
        except Exception as exc:
            if is_control(exc):
                raise
            log.warning("revision_failed", step_id=step.id, error=repr(exc))
            record["error"] = self._masking(state).masked_repr(exc)
            update["revisions"] = [*revisions, record]
            return "", None
        plan: PlanRecord = {**update.get("plan", state.get("plan", {}))}
        plan["steps"] = [
            revised.to_json() if s["id"] == step.id else s for s in plan.get("steps", [])
        ]
        record.update(
            {"command_after": list(revised.command), "policy": policy_note(step.id, decision)}
        )
        update["plan"] = plan
        update["revisions"] = [*revisions, record]
        approvals = dict(update.get("approvals", state.get("approvals", {})))
        if revised.requires_approval and approvals.pop(step.id, None) is not None:
            update["approvals"] = approvals  # the new command needs a decision of its own
        return "", decision

    async def _verify(
        self,
        state: WorkflowState,
        step: Step,
        result: JobResult,
        criteria: list[AcceptanceCriterion],
    ) -> Verification:
        preferences = state.get("preferences_effective") or {}
        try:
            return await self._caps.verifier.verify(
                step,
                result,
                criteria,
                preferences,
                run_id=state.get("run_id", ""),
                secrets=state_secrets(state),
            )
        except Exception as exc:
            if is_control(exc):
                raise
            log.warning("verifier_failed", step_id=step.id, error=repr(exc))
            why = (
                f"failed: {exc.message}"
                if isinstance(exc, WorkflowEngineError)
                else f"raised {self._masking(state).masked_repr(exc)}"
            )
            finding = Finding(check="verifier", passed=False, detail=f"the verifier {why}")
            return Verification(
                status="fail", findings=(finding,), recommended_actions=("verify the step again",)
            )


def _result_record(step_id: str, attempt: int, result: JobResult) -> ResultRecord:
    """A passed step's entry in `results`, for clients: no `work_dir`, which is the server's
    absolute path (the step's stored result keeps it for the verifier)."""
    return {
        "step_id": step_id,
        "attempt": attempt,
        "job_id": result.job_id,
        "status": result.status,
        "exit_code": result.exit_code,
        "stdout": result.stdout[-2000:],
        "ended_at": result.ended_at,
    }
