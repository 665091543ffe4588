"""The engine's use cases, below any transport: the gRPC servicer and the in-process `Engine`
both call `WorkflowService` and `ScheduleService`.

`_workflows` starts, resumes, updates, cancels, gets and lists workflows (`_task_by_id` finds
the task of a start that sent none; `_claims` claims a workflow and applies changes through its
lease; `_reads` reads within a caller's scope); `_watch` streams a workflow's events; `_checks`
holds the checks they make against a row before acting; `_schedules` creates, changes and
lists schedules.
"""

from workflow_engine.service._outcomes import Applied, ResumeOutcome
from workflow_engine.service._schedules import UPDATABLE, ScheduleDraft, ScheduleService
from workflow_engine.service._workflows import WorkflowService

__all__ = [
    "UPDATABLE",
    "Applied",
    "ResumeOutcome",
    "ScheduleDraft",
    "ScheduleService",
    "WorkflowService",
]
