"""A LangGraph checkpointer whose only checkpoint is the task's `workflow_checkpoints` row.

The orchestrator-visible row *is* the checkpoint LangGraph resumes from, so the two can never
disagree and state is stored once: the `state` column holds the workflow's state channels as
plain JSON, the `checkpoint` column holds LangGraph's bookkeeping (ids, channel versions,
versions seen, internal channel values). Nothing is pickled or msgpack-decoded on load, so a
tampered row can at worst be refused, never executed.

Each node's write is one fenced upsert: it checks the lease (holder and epoch, locked ``FOR
SHARE`` so a takeover waits for it or it sees the takeover), upserts the row and appends the
node's watch events, in one statement; the write that ends or pauses the workflow also releases
the lease. Writes of concurrent runs share that statement and its
commit (`group_commit`). A runner whose lease has moved on gets `LeaseLost`; nothing lands.

The saver stands on its own: it writes the row from what LangGraph hands it (the checkpoint,
its metadata, the channels the node updated) and two plain values in the run's config, the
fence (`FENCE_KEY`: holder, epoch, run id) and whether the run starts fresh (`FRESH_KEY`: no
checkpoint to read yet). Which node completed, and what came of it, travel in the internal
`node_event` channel the node wrapper writes (see `graph.builder`); a checkpoint that did not
update it (LangGraph's input bookkeeping) is not written. Stopping at a node boundary and
applying changes are the run's business, not the saver's.

What is deliberately not kept:
- history: the row holds the latest checkpoint only (that is the contract);
- the "input" checkpoints LangGraph writes before the first node of a run: the row already
  holds the input, and a run that dies before its first node simply starts again;
- intermediate writes (`aput_writes`): every superstep of this graph is one node, whose writes
  are part of the checkpoint written right after it. A node that dies half-way runs again.
  `build_graph` refuses a graph that could run two nodes in one superstep, and `aput_writes`
  raises if writes of a second node ever arrive for the same checkpoint, so a future fan-out
  cannot silently lose writes on resume.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from psycopg_pool import AsyncConnectionPool

from workflow_engine.domain.records import Fence, WorkflowEventRecord
from workflow_engine.domain.status import FINAL_STATUSES, WorkflowStatus
from workflow_engine.errors import CheckpointCorrupt, LeaseLost, OutsideWrite
from workflow_engine.faults import FaultPlan
from workflow_engine.storage.group_commit import CheckpointRow, GroupCommitter, WriteOutcome
from workflow_engine.storage.retry import with_retry

#: The task id LangGraph gives the writes of `update_state` (not a node's).
NULL_TASK_ID = "00000000-0000-0000-0000-000000000000"
#: How many threads `aput_writes` remembers the last writer of (oldest forgotten first).
_MAX_TRACKED_THREADS = 100_000

#: Keys in `config["configurable"]`: the `Fence` every write is checked against, and whether the
#: run starts from its input (True: there is no checkpoint to read; saves a round trip).
FENCE_KEY = "workflow_engine_fence"
FRESH_KEY = "workflow_engine_fresh"

# The last column says whether the row is still as the engine wrote it (see `OutsideWrite`).
READ_CHECKPOINT = """
SELECT state, checkpoint_id, checkpoint, checkpoint_metadata,
       engine_owned AND NOT changed_outside AND blocked_reason = ''
  FROM workflow_checkpoints
 WHERE task_id = %(task_id)s
"""

DELETE_WORKFLOW = """
WITH gone AS (DELETE FROM workflow_checkpoints WHERE task_id = %(task_id)s)
DELETE FROM workflow_events WHERE task_id = %(task_id)s
"""


#: The internal channel in which a node's wrapper (or a change applied with `aupdate_state`)
#: records what completed: ``{"node", "kind", "detail", "actor"}``. Not part of the state column.
NODE_EVENT = "node_event"


class WriteObserver(Protocol):
    """Told around each node's write: `writing` before it is sent, `written` with the events
    it appended once it is over (none when it failed): events mean the fence held when the
    write committed. `runtime.events.EventHub` and `runtime.manager.RunManager` are two."""

    def writing(self, task_id: str) -> None: ...

    def written(self, task_id: str, events: Sequence[WorkflowEventRecord]) -> None: ...


def row_status(state: dict[str, Any]) -> str:
    """The row's `status` column for a state's `status` field."""
    return WorkflowStatus.of_state(state.get("status"))


class RowCheckpointSaver(BaseCheckpointSaver[int]):
    """`BaseCheckpointSaver` over the single `workflow_checkpoints` row of each task (thread)."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        state_keys: frozenset[str],
        faults: FaultPlan | None = None,
    ) -> None:
        super().__init__()
        self._pool = pool
        self._state_keys = state_keys
        self._faults = faults or FaultPlan()
        self._observers: list[WriteObserver] = []
        self._committer = GroupCommitter(pool)
        # thread id -> (checkpoint id, task id) of the last node that wrote in that superstep.
        self._step_writers: dict[str, tuple[str, str]] = {}

    def observe(self, observer: WriteObserver) -> None:
        """Tell `observer` about every node's write from now on."""
        self._observers.append(observer)

    async def close(self) -> None:
        """Stop the group committer's flushers."""
        await self._committer.close()

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        task_id = _thread_id(config)
        configurable = config.get("configurable", {})
        if configurable.get(FRESH_KEY):
            return None  # saves a round trip per started workflow
        wanted = configurable.get("checkpoint_id")

        async def read() -> tuple[Any, ...] | None:
            async with self._pool.connection() as conn:
                cur = await conn.execute(READ_CHECKPOINT, {"task_id": task_id})
                row: tuple[Any, ...] | None = await cur.fetchone()
                return row

        row = await with_retry(read)
        if row is not None and not row[4]:
            raise OutsideWrite(task_id)  # never resumed from blindly
        if row is None or row[1] is None or (wanted and wanted != row[1]):
            return None
        state, checkpoint_id, stored, metadata, _ = row
        checkpoint = _rebuild_checkpoint(task_id, state, checkpoint_id, stored)
        return CheckpointTuple(
            config={
                "configurable": {
                    "thread_id": task_id,
                    "checkpoint_ns": "",
                    "checkpoint_id": checkpoint_id,
                }
            },
            checkpoint=checkpoint,
            metadata=cast(CheckpointMetadata, metadata if isinstance(metadata, dict) else {}),
            parent_config=None,
            pending_writes=[],
        )

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Yield the task's one checkpoint; there is no history to list."""
        if config is None or before is not None or limit == 0:
            return
        found = await self.aget_tuple(config)
        if found is None:
            return
        if filter and any(found.metadata.get(k) != v for k, v in filter.items()):
            return
        yield found

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        configurable = config["configurable"]
        task_id = str(configurable["thread_id"])
        next_config: RunnableConfig = {
            "configurable": {
                "thread_id": task_id,
                "checkpoint_ns": configurable.get("checkpoint_ns", ""),
                "checkpoint_id": checkpoint["id"],
            }
        }
        values = checkpoint["channel_values"]
        event = values.get(NODE_EVENT) if NODE_EVENT in new_versions else None
        if not isinstance(event, dict):
            return next_config  # LangGraph's input bookkeeping; see the module docstring
        node = str(event.get("node") or "")
        state = {k: v for k, v in values.items() if k in self._state_keys}
        # The node event is written to the events table below; keeping it in the checkpoint
        # too would only grow every row write (nothing reads it back: each node writes anew).
        internal = {
            k: v for k, v in values.items() if k not in self._state_keys and k != NODE_EVENT
        }
        bookkeeping = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        bookkeeping["channel_values"] = internal
        status = row_status(state)
        fence: Fence = configurable[FENCE_KEY]
        row = CheckpointRow(
            task_id=task_id,
            holder_id=fence.holder_id,
            epoch=fence.epoch,
            run_id=fence.run_id,
            state=state,
            node=node,
            status=status,
            checkpoint_id=checkpoint["id"],
            checkpoint=bookkeeping,
            metadata=_plain_metadata(metadata),
            summary=str(state.get("summary") or ""),
            error=str(state.get("error") or ""),
            event_kind=str(event.get("kind") or "node"),
            detail=str(event.get("detail") or ""),
            actor=str(event.get("actor") or ""),
            release=status in FINAL_STATUSES,
        )

        async def write() -> WriteOutcome:
            self._faults.at("before", node)
            outcome = await self._committer.write(row)
            self._faults.at("after", node)  # committed, but the answer may be "lost"
            return outcome

        for observer in self._observers:
            observer.writing(task_id)
        outcome: WriteOutcome | None = None
        try:
            outcome = await with_retry(write)
        finally:
            for observer in self._observers:
                observer.written(task_id, outcome.events if outcome is not None else ())
        if outcome.written == "lost":
            raise LeaseLost(task_id, fence.holder_id, fence.epoch)
        if outcome.written == "outside":
            raise OutsideWrite(task_id)
        return next_config

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Intermediate writes are folded into the next checkpoint; see the module docstring.

        Only one node may write per superstep (per checkpoint id): a second one would have its
        writes lost by a resume, so it is refused.
        """
        if task_id == NULL_TASK_ID:  # aupdate_state's writes, applied at once
            return
        configurable = config.get("configurable", {})
        step = (str(configurable.get("thread_id")), str(configurable.get("checkpoint_id")))
        writer = self._step_writers.get(step[0])
        if writer is not None and writer[0] == step[1] and writer[1] != task_id:
            raise RuntimeError(
                f"task {step[0]}: two nodes wrote in one superstep; the row checkpointer keeps "
                "no intermediate writes, so a resume would lose one (see build_graph)"
            )
        self._step_writers[step[0]] = (step[1], task_id)
        if len(self._step_writers) > _MAX_TRACKED_THREADS:
            self._step_writers.pop(next(iter(self._step_writers)))

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete the task's workflow row and its events."""
        async with self._pool.connection() as conn:
            await conn.execute(DELETE_WORKFLOW, {"task_id": thread_id})


def _thread_id(config: RunnableConfig) -> str:
    try:
        return str(config["configurable"]["thread_id"])
    except KeyError:
        raise ValueError("the run config needs configurable.thread_id (the task id)") from None


def _plain_metadata(metadata: CheckpointMetadata) -> dict[str, Any]:
    """The JSON-safe part of LangGraph's checkpoint metadata (source, step, parents)."""
    return {k: v for k, v in metadata.items() if k in ("source", "step", "parents", "run_id")}


def _rebuild_checkpoint(task_id: str, state: Any, checkpoint_id: str, stored: Any) -> Checkpoint:
    """Join the row's columns back into a LangGraph checkpoint, refusing anything malformed."""
    if not isinstance(state, dict):
        raise CheckpointCorrupt(f"task {task_id}: state is not a JSON object", task_id=task_id)
    if not isinstance(stored, dict):
        raise CheckpointCorrupt(f"task {task_id}: checkpoint is not a JSON object", task_id=task_id)
    internal = stored.get("channel_values")
    versions = stored.get("channel_versions")
    seen = stored.get("versions_seen")
    if not (
        isinstance(internal, dict)
        and isinstance(versions, dict)
        and isinstance(seen, dict)
        and all(isinstance(v, dict) for v in seen.values())
        and stored.get("id") == checkpoint_id
    ):
        raise CheckpointCorrupt(
            f"task {task_id}: checkpoint bookkeeping is malformed", task_id=task_id
        )
    marker = _object_marker(state) or _object_marker(stored)
    if marker:
        raise CheckpointCorrupt(
            f"task {task_id}: checkpoint holds a serialised object ({marker}); refused",
            task_id=task_id,
        )
    checkpoint: dict[str, Any] = dict(stored)
    checkpoint["channel_values"] = {**internal, **state}
    checkpoint.setdefault("updated_channels", None)
    return checkpoint  # type: ignore[return-value]


# Keys by which serialisation formats mark an object to rebuild. The engine's state is plain
# JSON and never contains them, so a row that does was edited by hand: refuse it.
_OBJECT_KEYS = ("__type__", "__class__", "py/object", "py/reduce", "$type")
_MAX_DEPTH = 64


def _object_marker(value: Any, depth: int = 0) -> str | None:
    """The first object-serialisation marker inside `value`, or None."""
    if depth > _MAX_DEPTH:
        return "nesting deeper than 64 levels"
    if isinstance(value, dict):
        if "lc" in value and value.get("type") in ("constructor", "secret", "not_implemented"):
            return "a LangChain constructor"
        for key in _OBJECT_KEYS:
            if key in value:
                return f"key {key!r}"
        values: Any = value.values()
    elif isinstance(value, list):
        values = value
    else:
        return None
    for item in values:
        found = _object_marker(item, depth + 1)
        if found:
            return found
    return None
