"""The task a workflow was started with, as StartWorkflow stored it (``workflow_tasks``).

`load_task_context` and `plan_steps` read the task here, never from a task source: the task is
stored with the workflow when it starts (sent inline or loaded by id), so a resume depends
neither on the source being reachable nor on the task being unchanged there. Not configurable.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable

from workflow_engine.domain.held import Held
from workflow_engine.domain.task import TaskSpec
from workflow_engine.domain.values import JsonObject


class StoredTasks:
    """Reads a task as StartWorkflow stored it; specs never change after start, so they are
    cached. `read` gets the stored JSON (lent by the engine: no storage import here)."""

    def __init__(
        self, read: Callable[[str], Awaitable[JsonObject]], *, cache_size: int = 1024
    ) -> None:
        self._read = read
        self._cache: OrderedDict[str, TaskSpec] = OrderedDict()
        self._cache_size = cache_size

    def held(self) -> list[Held]:
        return [Held("stored_tasks.cache", len(self._cache), self._cache_size)]

    def stored(self, task_id: str, spec: TaskSpec) -> None:
        """Cache a task just stored (StartWorkflow), so its first load needs no read."""
        self._cache[task_id] = spec
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def load(self, task_id: str) -> TaskSpec:
        """The stored task; `WorkflowNotFound` when the task has no workflow."""
        cached = self._cache.get(task_id)
        if cached is not None:
            self._cache.move_to_end(task_id)
            return cached
        spec = TaskSpec.from_json(await self._read(task_id))
        self.stored(task_id, spec)
        return spec
