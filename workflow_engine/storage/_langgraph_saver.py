"""LangGraph's own loop over a task's `workflow_checkpoints` row: a `BaseCheckpointSaver`.

The engine's runs do not use it: they step the graph themselves (`runtime._run`) and write the
row through `RowCheckpointer`. This saver is what makes "the row is a LangGraph checkpoint" a
fact rather than a hope: given to the compiled graph (`graph.compiled.builder.compile(
checkpointer=RowSaver(...))`), LangGraph's Pregel loop reads the row, runs the node it names
next, and writes each of its checkpoints back as the row, through the same fenced write as a
run (`RowCheckpointer.write`). `tests/integration/graph/test_langgraph_resumes.py` resumes rows
the engine wrote, stopped at several points, with it, and checks that LangGraph finishes each
as the engine's own loop does, with the LangGraph version `constraints.txt` pins.

A row joins two columns into one LangGraph checkpoint: the `checkpoint` column is LangGraph's
bookkeeping (``v``, ``id``, ``ts``, ``channel_versions``, ``versions_seen``,
``updated_channels``) whose ``channel_values`` hold only the next node's trigger
(``branch:to:<node>``); the `state` column holds the other channels' values. Like the row, the
saver keeps the latest checkpoint only: no history, and no pending writes (a node interrupted
before its checkpoint runs again, as under the engine). Versions are integers (LangGraph's
default), as the engine writes them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.base import Checkpoint as LangGraphCheckpoint

from workflow_engine.domain.records import Fence
from workflow_engine.domain.state_format import TRIGGER, triggered
from workflow_engine.domain.values import JsonObject
from workflow_engine.storage._checkpointer import Checkpoint, RowCheckpointer


class RowSaver(BaseCheckpointSaver[int]):
    """The row of `fence`'s task as LangGraph's checkpointer, for the one run that holds
    `fence`: it reads the row, and writes LangGraph's checkpoints as the row under the fence.

    `nodes` are the graph's nodes (a row naming another next node is refused, as a run refuses
    it); `event_key` is the channel in which each node records its event
    (`graph._builder.NODE_EVENT`), written as the node's event in the row's history.
    """

    def __init__(
        self,
        checkpoints: RowCheckpointer,
        fence: Fence,
        *,
        nodes: Iterable[str],
        event_key: str,
    ) -> None:
        super().__init__()
        self._checkpoints = checkpoints
        self._fence = fence
        self._nodes = frozenset(nodes)
        self._event_key = event_key

    def config(self) -> RunnableConfig:
        """The config that names this saver's row (LangGraph's thread is the task)."""
        return {"configurable": {"thread_id": self._fence.task_id, "checkpoint_ns": ""}}

    def _task_of(self, config: RunnableConfig) -> str:
        task_id = str(config.get("configurable", {}).get("thread_id", ""))
        if task_id != self._fence.task_id:
            raise ValueError(f"this saver holds task {self._fence.task_id}, not {task_id!r}")
        return task_id

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The row as LangGraph's latest checkpoint (None: no node has written it yet, or
        `config` asks for a checkpoint the row no longer holds)."""
        found = await self._checkpoints.read(self._task_of(config), self._nodes)
        if found is None:
            return None
        checkpoint = as_langgraph(found)
        wanted = config.get("configurable", {}).get("checkpoint_id")
        if wanted and wanted != checkpoint["id"]:
            return None  # the row keeps the latest checkpoint only
        metadata: CheckpointMetadata = {"source": "loop", "step": found.step, "parents": {}}
        return CheckpointTuple(self._config_of(checkpoint), checkpoint, metadata, None, [])

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """The row's one checkpoint: there is no history to list."""
        latest = await self.aget_tuple(config or self.config())
        if latest is not None and before is None and limit != 0:
            yield latest

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: LangGraphCheckpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Write `checkpoint` as the row, with the event of the node that wrote it (when it
        wrote one); `LeaseLost` when the fence no longer holds."""
        self._task_of(config)
        values = dict(checkpoint["channel_values"])
        next_nodes = triggered(values)
        if len(next_nodes) > 1:
            raise ValueError(f"the row holds one next node, not {sorted(next_nodes)}")
        event = values.get(self._event_key) if self._event_key in new_versions else None
        state = {k: v for k, v in values.items() if not k.startswith(TRIGGER)}
        bookkeeping: JsonObject = {
            k: v for k, v in checkpoint.items() if k not in ("channel_values", "pending_sends")
        }
        step = metadata.get("step")
        row = Checkpoint(
            state,
            next_nodes[0] if next_nodes else None,
            bookkeeping,
            step if isinstance(step, int) else 0,
        )
        await self._checkpoints.write(self._fence, row, dict(event or {"kind": "node"}))
        return self._config_of(checkpoint)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Nothing: the row keeps no pending writes (a node runs again after a crash)."""

    def _config_of(self, checkpoint: LangGraphCheckpoint) -> RunnableConfig:
        configurable = {**self.config()["configurable"], "checkpoint_id": checkpoint["id"]}
        return {"configurable": configurable}


def as_langgraph(found: Checkpoint[Any]) -> LangGraphCheckpoint:
    """A checkpoint read from the row as LangGraph's: the state's values and the next node's
    trigger as its channel values."""
    stored = found.stored()
    checkpoint: Any = {**stored, "channel_values": {**found.state, **stored["channel_values"]}}
    checkpoint.setdefault("updated_channels", None)
    result: LangGraphCheckpoint = checkpoint
    return result
