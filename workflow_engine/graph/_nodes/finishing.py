"""The ends of a workflow: its summary (`finalize_summary`), its failure (`mark_failed`), and a
suspension at a budget limit (`suspend_workflow`).
"""

from __future__ import annotations

import json

import structlog

from workflow_engine._masking import for_workflow, state_secrets
from workflow_engine.capabilities.model import ModelClient, answer_schemas, recording
from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.domain.values import JsonObject
from workflow_engine.errors import WorkflowEngineError
from workflow_engine.graph import routing
from workflow_engine.graph._nodes.base import NodeBase, accounted, is_control
from workflow_engine.graph.state import VerificationRecord, WorkflowState

log = structlog.get_logger(__name__)


_SUMMARY_SYSTEM = (
    "You write the final summary of a finished workflow for the person who asked for it: "
    'what was done, the evidence, anything left open. Answer as JSON: {"summary": "..."}.'
)


class Finishing(NodeBase):
    """Writes how the workflow ended."""

    async def finalize_summary(self, state: WorkflowState) -> WorkflowState:
        """Write the final summary: every step, its attempt, exit code and job id."""
        results = state.get("results", [])
        forced = state.get("forced_next") == "finalize_summary"
        lines = [
            f"Finalised by an operator with {len(results)} step(s) passed."
            if forced
            else f"All {len(results)} step(s) passed verification."
        ]
        for r in results:
            lines.append(
                f"- {r['step_id']}: attempt {r['attempt']}, exit {r['exit_code']}, "
                f"job {r['job_id']}"
            )
        if forced:
            lines += _remaining(state)
        update: WorkflowState = {
            "status": WorkflowStatus.SUCCEEDED.in_state,
            "summary": "\n".join(lines),
            "forced_next": None,
        }
        if self._caps.model_summary and self._caps.model is not None:
            with recording() as ledger:
                written = await _model_summary(self._caps.model, state, update["summary"])
            if written:
                update["summary"] = written
            update = accounted(state, update, ledger, "finalize_summary")
        return update

    async def mark_failed(self, state: WorkflowState) -> WorkflowState:
        """Record the failure with the failed steps' findings."""
        error = state.get("error") or ""
        if not error:
            failed = [
                f"step {sid} failed after {s.get('attempts', 0)} attempt(s): "
                + (s.get("error") or _failed_findings(s.get("verification")))
                for sid, s in state.get("steps", {}).items()
                if s.get("status") == "failed"
            ]
            error = "; ".join(failed) or "the plan cannot make progress"
        return {
            "status": WorkflowStatus.FAILED.in_state,
            "error": error,
            "summary": error,
            "forced_next": None,
        }

    async def suspend_workflow(self, state: WorkflowState) -> WorkflowState:
        """Stop at a budget limit, or where a wait for approval expired (see
        `graph.changes.expire`), with what was done and what remains; resumable."""
        expired = state.get("wait_expired") or {}
        reason = (
            expired.get("reason")
            or routing.budget_exhausted(state, self._clock.now())
            or "a budget limit was reached"
        )
        done = [r["step_id"] for r in state.get("results", [])]
        lines = [f"Suspended: {reason}.", f"Done ({len(done)}): {', '.join(done) or 'nothing'}."]
        lines += _remaining(state)
        if expired.get("cause") == "approval_timeout":
            lines.append(
                f"ResumeWorkflow continues from here: step {expired.get('step_id')} asks for "
                "approval again."
            )
        else:
            lines.append("ResumeWorkflow with a raised budget continues from here.")
        return {"status": WorkflowStatus.SUSPENDED.in_state, "summary": "\n".join(lines)}


async def _model_summary(model: ModelClient, state: WorkflowState, plain: str) -> str:
    """The model's summary of the workflow, or empty (the plain one stays) when it gives none.

    The model is told no secret: they are masked before the brief is encoded and cut."""
    brief = {
        "prompt": state.get("prompt", ""),
        "acceptance_criteria": state.get("acceptance_criteria", []),
        "plan": state.get("plan", {}),
        "results": state.get("results", []),
        "revisions": state.get("revisions", []),
        "engine_summary": plain,
    }
    messages: list[JsonObject] = [
        {"role": "system", "content": _SUMMARY_SYSTEM},
        {
            "role": "user",
            "content": json.dumps(
                for_workflow(model.secrets, state_secrets(state)).redact_json(brief)
            )[:20000],
        },
    ]
    try:
        answer = await model.answer("summary", messages, "summary", answer_schemas.SUMMARY)
    except WorkflowEngineError as exc:
        log.warning("model_summary_failed", error=exc.message)
        return ""
    except Exception as exc:  # the model's server is untrusted: its summary is optional
        if is_control(exc):
            raise
        log.warning("model_summary_failed", error=model.secrets.masked_repr(exc))
        return ""
    text = answer.get("summary") if isinstance(answer, dict) else None
    return text.strip()[:8000] if isinstance(text, str) and text.strip() else ""


def _failed_findings(verification: VerificationRecord | None) -> str:
    findings = (verification or {}).get("findings", [])
    return "; ".join(f["detail"] for f in findings if not f.get("passed"))


def _remaining(state: WorkflowState) -> list[str]:
    lines = []
    for s in routing.plan_steps(state):
        st = routing.step_state(state, s["id"])
        if st["status"] != "passed":
            lines.append(
                f"- remaining: {s['id']} ({st['status']}, {st.get('attempts', 0)} attempt(s))"
            )
    return lines
