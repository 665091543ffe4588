"""The task a StartWorkflow without one gets: the task source's, by id, within the caller's
scope; or, when the source refuses a task that already has a workflow, the task stored with it.
And the check of a task sent inline: its id is not a task the source has under another tenant.
"""

from __future__ import annotations

from workflow_engine.capabilities import TaskSource
from workflow_engine.domain.records import Scope
from workflow_engine.domain.task import TaskSpec
from workflow_engine.errors import (
    InvalidArgument,
    TaskNotFound,
    TaskNotStartable,
    TaskSourceUnavailable,
    WorkflowEngineError,
    WorkflowNotFound,
)
from workflow_engine.service._checks import admits
from workflow_engine.storage import Pool, queries, tasks


async def task_by_id(pool: Pool, source: TaskSource, task_id: str, scope: Scope | None) -> TaskSpec:
    """The task source's task, for a start that sent none.

    A task that already has a workflow is answered as before (ALREADY_RUNNING, ...) even
    when the source now refuses it (closed since, deleted, unreachable): the task stored
    with that workflow stands in, and nothing new is stored for it.

    Another tenant's task (`scope` does not admit it) is answered as one the source does
    not have, in its words: not whose it is, not that it is closed, not that it has a
    workflow.
    """
    try:
        task = await source.load(task_id)
    except TaskNotStartable as refused:
        if not admits(scope, refused.user_id, refused.project_id):
            raise TaskNotFound(task_id, source.where) from None
        return await _stored_instead(pool, task_id, refused, scope)
    except (TaskNotFound, TaskSourceUnavailable) as refused:
        return await _stored_instead(pool, task_id, refused, scope)
    if not admits(scope, task.metadata.user_id, task.metadata.project_id):
        raise TaskNotFound(task_id, source.where)
    return task


async def check_inline_task_id(source: TaskSource, task_id: str, scope: Scope | None) -> None:
    """Refuse a scoped caller's inline task the id of a task the source has under another
    tenant, as a task the source does not have.

    The orchestrator reads a task's workflow row by the task's id: a workflow another tenant
    started under it (its own task, inline) would be read as the task owner's, its status and
    summary included, and would keep the owner from starting one. A source that cannot say
    whose the id is (`TaskSourceUnavailable`) refuses the start too; a source that has no such
    task, or no source at all, lets it go on.
    """
    if scope is None:
        return
    try:
        known = await source.load(task_id)
        owner = (known.metadata.user_id, known.metadata.project_id)
    except TaskNotStartable as refused:
        owner = (refused.user_id, refused.project_id)
    except (TaskNotFound, InvalidArgument):
        return
    if not admits(scope, *owner):
        raise TaskNotFound(task_id, source.where)


async def _stored_instead(
    pool: Pool, task_id: str, refused: WorkflowEngineError, scope: Scope | None
) -> TaskSpec:
    """The task stored with the task's workflow, for a start the source refused; without
    one (no workflow, or retention removed its task), or when it is another tenant's, the
    source's refusal as it is."""
    try:
        await queries.get(pool, task_id)
        stored = await tasks.load(pool, task_id)
    except WorkflowNotFound:
        raise refused from None
    task = TaskSpec.from_json(stored)
    if not admits(scope, task.metadata.user_id, task.metadata.project_id):
        raise refused from None
    return task
