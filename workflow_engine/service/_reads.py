"""The workflow service's reads: a workflow, its history and pages of workflows, each within
the caller's scope; and the scope checks the changes share (`WorkflowService`)."""

from __future__ import annotations

from collections.abc import Sequence

from workflow_engine.domain.records import (
    Scope,
    WorkflowEventRecord,
    WorkflowPage,
    WorkflowQuery,
    WorkflowRecord,
)
from workflow_engine.errors import WorkflowExists, WorkflowNotFound
from workflow_engine.service._checks import in_scope
from workflow_engine.storage import Pool, queries
from workflow_engine.storage.queries import MAX_HISTORY_EVENTS


class WorkflowReads:
    """Reads of the workflows in `_pool` (set by the service that extends this)."""

    _pool: Pool

    async def get(self, task_id: str, scope: Scope | None = None) -> WorkflowRecord:
        return in_scope(await queries.get(self._pool, task_id), scope)

    async def get_with_history(
        self, task_id: str, scope: Scope | None = None
    ) -> tuple[WorkflowRecord, Sequence[WorkflowEventRecord]]:
        """The workflow and its events, oldest first (the newest `MAX_HISTORY_EVENTS` of them)."""
        record, history = await queries.get_with_history(self._pool, task_id, MAX_HISTORY_EVENTS)
        return in_scope(record, scope), history

    async def _taken_in_scope(self, task_id: str, scope: Scope | None) -> None:
        """A start met an existing workflow: tell a scoped caller nothing about another
        tenant's (its status, its lease holder), only that the task id is taken."""
        if scope is None:
            return
        try:
            await self._check_scope(task_id, scope)
        except WorkflowNotFound:
            raise WorkflowExists(task_id, "not shown") from None

    async def _check_scope(self, task_id: str, scope: Scope | None) -> None:
        """NOT_FOUND, as for a workflow that does not exist, unless `scope` admits it."""
        if scope is not None:
            in_scope(await queries.get(self._pool, task_id), scope)

    async def list_workflows(self, query: WorkflowQuery) -> WorkflowPage:
        """One page of workflows matching `query`, newest update first (no state, no history)."""
        return await queries.list_workflows(self._pool, query)
