"""Task sources: where a workflow's task comes from, as the engine's `TaskSpec`.

`_inline` (StartWorkflow's own), `_table` (the orchestrator's ``tasks`` table), `_mcp` (the
orchestrator's MCP server), `_stored` (the task as StartWorkflow stored it), and
`_orchestrator`, the one mapping from the orchestrator's task to a `TaskSpec`; `_preferences`
folds the preference layers a run uses.

What the factory, the planner and the graph use (`__all__`): the four sources and the two
preference folds. `McpTaskSource` is imported on first use: the MCP SDK is about 1.5 s of CPU
that an engine with another task source never pays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workflow_engine.capabilities.tasks._inline import InlineTaskSource
from workflow_engine.capabilities.tasks._preferences import merge_preferences, node_preferences
from workflow_engine.capabilities.tasks._stored import StoredTasks
from workflow_engine.capabilities.tasks._table import TaskTableSource

if TYPE_CHECKING:
    from workflow_engine.capabilities.tasks._mcp import McpTaskSource

__all__ = [
    "InlineTaskSource",
    "McpTaskSource",
    "StoredTasks",
    "TaskTableSource",
    "merge_preferences",
    "node_preferences",
]


def __getattr__(name: str) -> object:
    """`McpTaskSource`, imported on first use."""
    if name == "McpTaskSource":
        from workflow_engine.capabilities.tasks._mcp import McpTaskSource

        return McpTaskSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
