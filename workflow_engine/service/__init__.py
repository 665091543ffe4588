"""The engine's use cases, below any transport: the gRPC servicer and the in-process `Engine`
both call `WorkflowService`.

`workflows` starts, resumes, updates, cancels, gets and lists workflows (`task_by_id` finds the
task of a start that sent none; `claims` claims a workflow and applies changes through its
lease; `reads` reads within a caller's scope); `watch` streams a workflow's events; `checks`
holds the checks they make against a row before acting.
"""

from workflow_engine.service._outcomes import Applied, ResumeOutcome
from workflow_engine.service._workflows import WorkflowService

__all__ = ["Applied", "ResumeOutcome", "WorkflowService"]
