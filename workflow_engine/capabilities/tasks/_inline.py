"""The default task source, ``inline``: the task comes with StartWorkflow.

With no source configured, a StartWorkflow without a task still starts one the orchestrator
has in its ``tasks`` table, when the engine's database has that table (the orchestrator and
the engine sharing one database, as their deployment does); otherwise the task is required.
"""

from __future__ import annotations

from workflow_engine.capabilities.tasks._table import TaskTableSource
from workflow_engine.domain.task import TaskSpec
from workflow_engine.errors import InvalidArgument


class InlineTaskSource:
    """No source of its own: the orchestrator's tasks table when there is one, else nothing."""

    def __init__(self, table: TaskTableSource) -> None:
        self._table = table
        self.where = table.where

    async def load(self, task_id: str) -> TaskSpec:
        if await self._table.available():
            return await self._table.load(task_id)
        raise InvalidArgument(
            "task",
            "required (no task source is configured and the database has no orchestrator "
            "tasks table to load it from by id)",
        )
