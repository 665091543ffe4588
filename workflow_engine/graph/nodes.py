"""The seven nodes of the workflow graph.

Each node reads the state, calls one capability, and returns the keys it changes. Every node is
safe to run again: a node that was running when the process died runs again on resume, so
`dispatch_step` only *records* a job (with an id fixed by task, step and attempt) and
`collect_result` runs it through a worker that never runs one job id twice.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import structlog
from pydantic import ValidationError

from workflow_engine.capabilities.factory import Capabilities
from workflow_engine.capabilities.job_tracker import JobTracker
from workflow_engine.capabilities.model import answer_schemas
from workflow_engine.capabilities.model.llm_planner import PlanRefused
from workflow_engine.capabilities.model.model_client import Ledger, ModelClient, recording
from workflow_engine.capabilities.protocols import RevisingPlanner
from workflow_engine.capabilities.tasks.preferences import merge_preferences, node_preferences
from workflow_engine.domain.jobs import Finding, JobRequest, JobResult, Sandbox, Verification
from workflow_engine.domain.status import WorkflowStatus
from workflow_engine.domain.task import (
    LOADER_PROBLEM,
    AcceptanceCriterion,
    Step,
    loader_variables,
)
from workflow_engine.domain.values import JsonObject, as_invalid_argument
from workflow_engine.errors import InvalidArgument, RunControl, WorkflowEngineError
from workflow_engine.graph import routing
from workflow_engine.graph.state import StepState, StepStatus, WorkflowState
from workflow_engine.secrets import SECRETS, masked_repr, redact_json, state_secrets

log = structlog.get_logger(__name__)

#: Namespace of job ids: uuid5(JOB_NAMESPACE, "<task_id>/<step_id>/<attempt>").
JOB_NAMESPACE = uuid.UUID("5b0d7d0e-8f3c-4f7e-9a57-0e1f6c8a2b11")


def job_id_for(task_id: str, step_id: str, attempt: int) -> str:
    """The deterministic job id of one attempt at one step."""
    return str(uuid.uuid5(JOB_NAMESPACE, f"{task_id}/{step_id}/{attempt}"))


def is_control(exc: BaseException) -> bool:
    """What must stop the run rather than be recorded as the task's failure: a run-control
    signal (which no `except Exception` catches anyway), or a database that stayed unreachable
    beyond the retries (the checkpoint is intact; a resume continues)."""
    return isinstance(exc, RunControl | psycopg.Error)


class Nodes:
    """The node functions, bound to their capabilities."""

    def __init__(self, capabilities: Capabilities, jobs: JobTracker | None = None) -> None:
        self._caps = capabilities
        self.jobs = jobs or capabilities.jobs

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
            "budget": task.budget.to_json(),
            "started_at": state.get("started_at") or time.time(),
        }

    async def plan_steps(self, state: WorkflowState) -> WorkflowState:
        """Turn the task into executable steps; a plan that cannot run is an error."""
        with recording() as ledger:
            update = await self._plan(state)
        return _accounted(state, update, ledger, "plan_steps")

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
            return {"error": f"planner failed: {exc.message}", "verification": verdict.to_json()}
        except Exception as exc:
            if is_control(exc):
                raise
            log.warning("planner_failed", error=repr(exc))
            return {"error": f"planner failed: {masked_repr(exc)}"}
        update: WorkflowState = {
            "plan": plan.to_json(),
            "current_step_index": 0,
            "attempts_by_step": {},
            "steps": {s.id: {"status": "pending", "attempts": 0} for s in plan.steps},
        }
        if not plan.steps:
            update["error"] = "planner produced no steps: " + "; ".join(plan.assumptions)
        return update

    async def dispatch_step(self, state: WorkflowState) -> WorkflowState:
        """Record a job for every step that may start now, before anything runs.

        Bounded by the task's `max_parallel_steps` and its budget. A step that requires approval
        and has none pauses the workflow instead, once nothing else is in flight.
        """
        steps = _steps_copy(state)
        flying = routing.in_flight(state)
        room = int(state.get("max_parallel_steps") or 1) - len(flying)
        approvals = state.get("approvals", {})
        now = time.time()
        dispatches = int(state.get("dispatches", 0))
        update: WorkflowState = {}
        dispatched: list[str] = []
        for step_id in routing.ready(state):
            step = _step(state, step_id)
            if refused := loader_variables(step.env):
                steps[step_id] = _refused_env(steps[step_id], step.id, refused)
                continue
            if step.requires_approval and step_id not in approvals:
                if not flying and not dispatched:
                    return _approval_request(state, step, now)
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
            job_id=job_id_for(state["task_id"], step.id, attempt),
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
            failed = _worker_error_result(job, exc)  # verified as a failure, then retried
            return {
                **previous,
                "status": "collected",
                "attempts": attempt,
                "result": failed.to_json(),
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
        return await self._caps.compressor.compress(entries, self._caps.context_budget_chars)

    async def collect_result(self, state: WorkflowState) -> WorkflowState:
        """Wait for the jobs in flight (re-attaching after a restart); keep those that ended.

        Returns as soon as at least one has ended, so its result is checkpointed while the
        others run on.
        """
        steps = _steps_copy(state)
        flying = [sid for sid in routing.in_flight(state) if steps[sid]["status"] == "dispatched"]
        if not flying:
            return {}
        jobs = {
            sid: (
                str((steps[sid].get("job") or {}).get("target", "")),
                JobRequest.from_json((steps[sid].get("job") or {})["request"]),
            )
            for sid in flying
        }
        ended = await self.jobs.wait_any(list(jobs.values()))
        update: WorkflowState = {}
        for sid, (_, job) in jobs.items():
            if job.job_id not in ended:
                continue
            outcome = ended[job.job_id]
            if isinstance(outcome, BaseException):
                if is_control(outcome):
                    raise outcome
                log.warning("worker_failed", job_id=job.job_id, error=repr(outcome))
                outcome = _worker_error_result(job, outcome)
            result = outcome.to_json()
            steps[sid] = {**steps[sid], "status": "collected", "result": result}
            update.update({"last_result": result, "last_step_id": sid})
        update["steps"] = steps
        return update

    async def verify_step_result(self, state: WorkflowState) -> WorkflowState:
        """Judge every collected result: a pass records it, a fail is retried while attempts
        remain (with the step revised by the planner, when configured) and fails the step when
        none do."""
        with recording() as ledger:
            update = await self._verify_all(state)
        return _accounted(state, update, ledger, "verify_step_result")

    async def _verify_all(self, state: WorkflowState) -> WorkflowState:
        steps = _steps_copy(state)
        plan = routing.plan_steps(state)
        final_id = plan[-1]["id"] if plan else ""
        results = list(state.get("results", []))
        context = dict(state.get("context", {}))
        update: WorkflowState = {}
        for sid in [s["id"] for s in plan if steps[s["id"]]["status"] == "collected"]:
            step = _step(state, sid)
            result = JobResult.from_json(steps[sid].get("result") or {})
            criteria = (
                [AcceptanceCriterion.from_json(c) for c in state.get("acceptance_criteria", [])]
                if sid == final_id
                else []
            )
            verification = await self._verify(
                step, result, criteria, state.get("preferences_effective") or {}
            )
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
                error = await self._revise(state, update, step, attempts, result, verification)
                if error:
                    status = "failed"
            else:
                status = "failed"
            verdict = verification.to_json()
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
    ) -> str:
        """Have the planner revise `step` for its next attempt, recording the revision in
        `update` (the plan, `revisions`); the error that fails the step, or empty.

        A planner that cannot revise leaves the step as it was (the retry still gets the
        findings as remediation); a revision the command policy refuses fails the step.
        """
        planner = self._caps.planner
        if not self._caps.revise_steps or not isinstance(planner, RevisingPlanner):
            return ""
        task = await self._caps.stored_tasks.load(state["task_id"])
        failed = "; ".join(f.detail for f in verification.findings if not f.passed)
        reason = SECRETS.redact_part(failed, 1000)[0]  # masked before it is cut
        revisions = list(update.get("revisions", state.get("revisions", [])))
        record: JsonObject = {
            "step_id": step.id,
            "after_attempt": attempt,
            "reason": reason,
            "command_before": list(step.command),
        }
        try:
            revised, note = await planner.revise(task, step, result, verification)
        except WorkflowEngineError as exc:
            record["error"] = exc.message
            update["revisions"] = [*revisions, record]
            if isinstance(exc, PlanRefused):
                return f"revision refused: {exc.message}"
            log.warning("revision_failed", step_id=step.id, error=exc.message)
            return ""
        except Exception as exc:
            if is_control(exc):
                raise
            log.warning("revision_failed", step_id=step.id, error=repr(exc))
            record["error"] = masked_repr(exc)
            update["revisions"] = [*revisions, record]
            return ""
        plan = dict(update.get("plan", state.get("plan", {})))
        plan["steps"] = [
            revised.to_json() if s["id"] == step.id else s for s in plan.get("steps", [])
        ]
        record.update({"command_after": list(revised.command), "policy": note})
        update["plan"] = plan
        update["revisions"] = [*revisions, record]
        approvals = dict(update.get("approvals", state.get("approvals", {})))
        if revised.requires_approval and approvals.pop(step.id, None) is not None:
            update["approvals"] = approvals  # the new command needs a decision of its own
        return ""

    async def _verify(
        self,
        step: Step,
        result: JobResult,
        criteria: list[AcceptanceCriterion],
        preferences: JsonObject,
    ) -> Verification:
        try:
            return await self._caps.verifier.verify(step, result, criteria, preferences)
        except Exception as exc:
            if is_control(exc):
                raise
            log.warning("verifier_failed", step_id=step.id, error=repr(exc))
            why = (
                f"failed: {exc.message}"
                if isinstance(exc, WorkflowEngineError)
                else f"raised {masked_repr(exc)}"
            )
            finding = Finding(check="verifier", passed=False, detail=f"the verifier {why}")
            return Verification(
                status="fail", findings=(finding,), recommended_actions=("verify the step again",)
            )

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
            update = _accounted(state, update, ledger, "finalize_summary")
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
        """Stop at a budget limit with what was done and what remains; resumable with more."""
        reason = routing.budget_exhausted(state, time.time()) or "a budget limit was reached"
        done = [r["step_id"] for r in state.get("results", [])]
        lines = [f"Suspended: {reason}.", f"Done ({len(done)}): {', '.join(done) or 'nothing'}."]
        lines += _remaining(state)
        lines.append("ResumeWorkflow with a raised budget continues from here.")
        return {"status": WorkflowStatus.SUSPENDED.in_state, "summary": "\n".join(lines)}


MAX_CONTEXT_OUTPUT = 4000
_SUMMARY_SYSTEM = (
    "You write the final summary of a finished workflow for the person who asked for it: "
    'what was done, the evidence, anything left open. Answer as JSON: {"summary": "..."}.'
)


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
            "content": json.dumps(SECRETS.redact_json(redact_json(brief, state_secrets(state))))[
                :20000
            ],
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
        log.warning("model_summary_failed", error=masked_repr(exc))
        return ""
    text = answer.get("summary") if isinstance(answer, dict) else None
    return text.strip()[:8000] if isinstance(text, str) and text.strip() else ""


def _accounted(
    state: WorkflowState, update: WorkflowState, ledger: Ledger, node: str
) -> WorkflowState:
    """`update` with the model calls in `ledger` added to the state's records and total."""
    if ledger.calls:
        calls = [{**call.to_json(), "node": node} for call in ledger.calls]
        update["model_calls"] = [*state.get("model_calls", []), *calls]
        update["model_tokens"] = int(state.get("model_tokens", 0)) + ledger.tokens
    return update


def _revision_notes(state: WorkflowState, step_id: str) -> list[str]:
    return [
        str(r.get("policy", ""))
        for r in state.get("revisions", [])
        if r.get("step_id") == step_id and r.get("policy")
    ]


def _steps_copy(state: WorkflowState) -> dict[str, StepState]:
    return {
        s["id"]: dict(routing.step_state(state, s["id"]))  # type: ignore[misc]
        for s in routing.plan_steps(state)
    }


def _step(state: WorkflowState, step_id: str) -> Step:
    for data in routing.plan_steps(state):
        if data["id"] == step_id:
            return Step.from_json(data)
    raise KeyError(step_id)


def _refused_env(previous: StepState, step_id: str, names: list[str]) -> StepState:
    """A step whose env sets the loader's variables (stored by an earlier version, which did
    not refuse them): failed with a finding, and nothing dispatched."""
    detail = (
        f"step {step_id} was not run: its env sets {', '.join(names)}, which "
        + LOADER_PROBLEM.removeprefix("is ")
    )
    finding = Finding(check="env", passed=False, detail=detail)
    verification = Verification(status="fail", findings=(finding,))
    return {**previous, "status": "failed", "error": detail, "verification": verification.to_json()}


def _approval_request(state: WorkflowState, step: Step, now: float) -> WorkflowState:
    reason = f"step {step.id} requires approval before it runs"
    # A model-planned step: say which rule of the command policy asked for the approval.
    prefix = f"command policy: step {step.id} waits for approval"
    notes = [*state.get("plan", {}).get("assumptions", []), *_revision_notes(state, step.id)]
    policy = next((n for n in reversed(notes) if str(n).startswith(prefix)), None)
    if policy:
        reason += f" ({str(policy)[len(prefix) :].strip(' ()')}; the model planned it)"
    return {
        "status": WorkflowStatus.WAITING_FOR_APPROVAL.in_state,
        "pending_approval": {
            "step_id": step.id,
            "description": step.description,
            "command": list(step.command),
            "env": dict(step.env),
            "reason": reason,
            "requested_at": now,
        },
    }


def _result_record(step_id: str, attempt: int, result: JobResult) -> JsonObject:
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


def _failed_findings(verification: JsonObject | None) -> str:
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


def jobs_in_flight(state: WorkflowState) -> list[tuple[str, JobRequest]]:
    """The (target, request) of every job the state records as dispatched and not collected."""
    jobs = []
    for sid in routing.in_flight(state):
        step = routing.step_state(state, sid)
        job = step.get("job") or {}
        if step["status"] == "dispatched" and job.get("request"):
            jobs.append((str(job.get("target", "")), JobRequest.from_json(job["request"])))
    return jobs


def _worker_error_result(job: JobRequest, exc: BaseException) -> JobResult:
    # The engine's own errors say what happened in their message; anything else by its repr.
    error = exc.message if isinstance(exc, WorkflowEngineError) else masked_repr(exc)
    now = datetime.now(UTC).isoformat()
    return JobResult(
        task_id=job.task_id,
        job_id=job.job_id,
        status="failed",
        exit_code=None,
        stdout="",
        stderr=f"worker error: {error}",
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
        "suspend_workflow": nodes.suspend_workflow,
    }
