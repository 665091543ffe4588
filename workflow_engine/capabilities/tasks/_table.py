"""The ``orchestrator`` task source: the orchestrator's ``tasks`` table, in the engine's database.

The engine lends the two reads (`storage.orchestrator_tasks`, through its pool); the row becomes
a task as `orchestrator_task` says. The ``inline`` source falls back to this one when the
database has the table.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from workflow_engine.capabilities.tasks._orchestrator import task_from_orchestrator
from workflow_engine.domain.task import TaskSpec
from workflow_engine.domain.values import JsonObject
from workflow_engine.errors import TaskNotFound, TaskSourceUnavailable

WHERE = "the orchestrator's tasks table"


class TaskTableSource:
    """Loads a task from the orchestrator's ``tasks`` table by its id."""

    where = WHERE

    def __init__(
        self,
        read_task: Callable[[str], Awaitable[JsonObject | None]],
        table_exists: Callable[[], Awaitable[bool]],
    ) -> None:
        self._read_task = read_task
        self._table_exists = table_exists
        self._seen_table = False

    async def available(self) -> bool:
        """Whether the database has the table. Asked of the catalog until it is there, then
        remembered for the life of the process (their tables are not dropped under us)."""
        if not self._seen_table:
            self._seen_table = await self._table_exists()
        return self._seen_table

    async def load(self, task_id: str) -> TaskSpec:
        if not await self.available():
            raise TaskSourceUnavailable(task_id, WHERE, "the database has no such table")
        row = await self._read_task(task_id)
        if row is None:
            raise TaskNotFound(task_id, WHERE)
        return task_from_orchestrator(task_id, row, source=WHERE)
