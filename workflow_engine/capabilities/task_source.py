"""The embedded task source: the `TaskSpec` sent with StartWorkflow, as stored with the workflow."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable

from workflow_engine.domain.model import JsonObject
from workflow_engine.domain.task import TaskSpec


class InlineTaskSource:
    """Loads a task as StartWorkflow stored it; specs never change after start, so they are
    cached. `load_task` reads the stored JSON (lent by the engine: no storage import here)."""

    def __init__(
        self, load_task: Callable[[str], Awaitable[JsonObject]], *, cache_size: int = 1024
    ) -> None:
        self._load_task = load_task
        self._cache: OrderedDict[str, TaskSpec] = OrderedDict()
        self._cache_size = cache_size

    def stored(self, task_id: str, spec: TaskSpec) -> None:
        """Cache a task just stored (StartWorkflow), so its first load needs no read."""
        self._cache[task_id] = spec
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def load(self, task_id: str) -> TaskSpec:
        cached = self._cache.get(task_id)
        if cached is not None:
            self._cache.move_to_end(task_id)
            return cached
        spec = TaskSpec.from_json(await self._load_task(task_id))
        self.stored(task_id, spec)
        return spec
