"""The embedded task source: the `TaskSpec` sent with StartWorkflow, as stored with the workflow."""

from __future__ import annotations

from collections import OrderedDict

from workflow_engine.spec import TaskSpec
from workflow_engine.storage.workflows import WorkflowStore


class InlineTaskSource:
    """Loads a task from `workflow_tasks`; specs never change after start, so they are cached."""

    def __init__(self, store: WorkflowStore, *, cache_size: int = 1024) -> None:
        self._store = store
        self._cache: OrderedDict[str, TaskSpec] = OrderedDict()
        self._cache_size = cache_size

    def remember(self, task_id: str, spec: TaskSpec) -> None:
        """Cache a task just stored (StartWorkflow), so its first load needs no read."""
        self._cache[task_id] = spec
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def load(self, task_id: str) -> TaskSpec:
        cached = self._cache.get(task_id)
        if cached is not None:
            self._cache.move_to_end(task_id)
            return cached
        spec = TaskSpec.from_json(await self._store.load_task(task_id))
        self.remember(task_id, spec)
        return spec
