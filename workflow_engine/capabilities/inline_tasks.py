"""The default task source, ``inline``: the task comes with StartWorkflow, or not at all."""

from __future__ import annotations

from workflow_engine.domain.task import TaskSpec
from workflow_engine.errors import InvalidArgument


class InlineTaskSource:
    """No source to load from: a StartWorkflow must send its task."""

    async def load(self, task_id: str) -> TaskSpec:
        raise InvalidArgument("task", "required")
