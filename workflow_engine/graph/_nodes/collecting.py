"""Collect: wait for the jobs in flight and keep the results of those that ended
(`collect_result`).
"""

from __future__ import annotations

import structlog

from workflow_engine.domain.jobs import JobRequest
from workflow_engine.graph import routing
from workflow_engine.graph._nodes.base import NodeBase, is_control, steps_copy, worker_error_result
from workflow_engine.graph.state import JobResultRecord, WorkflowState, as_record

log = structlog.get_logger(__name__)


class Collecting(NodeBase):
    """Runs (or re-attaches to) the recorded jobs and keeps what they return."""

    async def collect_result(self, state: WorkflowState) -> WorkflowState:
        """Wait for the jobs in flight (re-attaching after a restart); keep those that ended.

        Returns as soon as at least one has ended, so its result is checkpointed while the
        others run on.
        """
        steps = steps_copy(state)
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
                outcome = worker_error_result(job, outcome, self._masking(state))
            result = as_record(JobResultRecord, outcome)
            steps[sid] = {**steps[sid], "status": "collected", "result": result}
            update.update({"last_result": result, "last_step_id": sid})
        update["steps"] = steps
        return update
