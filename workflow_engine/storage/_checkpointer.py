"""The task's checkpoint is its `workflow_checkpoints` row: read it, and write it after each node.

The orchestrator-visible row *is* the checkpoint a run resumes from, so the two can never
disagree and state is stored once: the `state` column holds the workflow's state as plain
JSON, the `checkpoint` column the graph's bookkeeping in LangGraph's checkpoint format
(version 4: ids, channel versions, versions seen, updated channels, and the trigger of the node
that runs next, ``branch:to:<node>``). Together they are a checkpoint LangGraph's own loop
resumes (`storage._langgraph_saver.RowSaver`), which
`tests/integration/graph/test_langgraph_resumes.py` holds for the pinned LangGraph; the keys it
depends on are listed in docs/architecture.md, "What LangGraph is for". Nothing is pickled or
msgpack-decoded on load, so a tampered row can at worst be refused, never executed. Rows
written by LangGraph's own loop (before the engine drove the graph itself; see `runtime._run`)
read the same way.

Each node's write is one fenced upsert: it checks the lease (holder and epoch, locked ``FOR
SHARE`` so a takeover waits for it or it sees the takeover), upserts the row and appends the
node's watch events, in one statement; the write that ends or pauses the workflow also releases
the lease. Writes of concurrent runs share that statement and its commit (`group_commit`). A
runner whose lease has moved on gets `LeaseLost`; nothing lands.

What is deliberately not kept: history. The row holds the latest checkpoint only (that is the
contract); the events table keeps what happened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from langgraph.checkpoint.base.id import uuid6
from psycopg_pool import AsyncConnectionPool

from workflow_engine._context import EngineContext
from workflow_engine._masking import for_workflow, state_secrets
from workflow_engine.domain.deadlines import wake_at
from workflow_engine.domain.records import Fence, WorkflowEventRecord
from workflow_engine.domain.state_format import (
    STATE_FORMAT,
    TRIGGER,
    readable,
    triggered,
    unreadable_reason,
)
from workflow_engine.domain.status import FINAL_STATUSES, WorkflowStatus
from workflow_engine.domain.values import JsonObject
from workflow_engine.errors import (
    CheckpointCorrupt,
    LeaseLost,
    OutsideWrite,
    UnreadableStateFormat,
)
from workflow_engine.storage._group_commit import CheckpointRow, GroupCommitter, WriteOutcome
from workflow_engine.storage._retry import with_retry
from workflow_engine.version import __version__

# The last column says whether the row is still as the engine wrote it (see `OutsideWrite`).
READ_CHECKPOINT = """
SELECT state, checkpoint_id, checkpoint, checkpoint_metadata,
       engine_owned AND NOT changed_outside AND blocked_reason = '',
       state_format, engine_version
  FROM workflow_checkpoints
 WHERE task_id = %(task_id)s
"""

#: A checkpoint's state: a JSON object as read from the row, or the workflow's typed state
#: (the run validates what it reads; see `graph.state.read_state`).
S = TypeVar("S", bound=Mapping[str, Any])
T = TypeVar("T", bound=Mapping[str, Any])

#: LangGraph's checkpoint format version, which the bookkeeping follows.
FORMAT = 4


#: Rewrites a stored row's state and checkpoint columns, of the given state format, into this
#: engine's format (`graph.formats.upgrade`): (format, task id, state, checkpoint).
Upgrade = Callable[[int, str, Any, Any], tuple[Any, Any]]


def _as_is(state_format: int, task_id: str, state: Any, checkpoint: Any) -> tuple[Any, Any]:
    return state, checkpoint


class WriteObserver(Protocol):
    """Told around each node's write: `writing` before it is sent, `written` with the events
    it appended once it is over (none when it failed): events mean the fence held when the
    write committed. `runtime._events.EventHub` and `runtime._manager.RunManager` are two."""

    def writing(self, task_id: str) -> None: ...

    def written(self, task_id: str, events: Sequence[WorkflowEventRecord]) -> None: ...


def row_status(state: Mapping[str, Any]) -> str:
    """The row's `status` column for a state's `status` field."""
    return WorkflowStatus.of_state(state.get("status"))


@dataclass(frozen=True, slots=True)
class Checkpoint(Generic[S]):
    """A task's latest checkpoint: its state, and the node that runs next (None: the graph
    ended or paused there)."""

    state: S
    next_node: str | None
    bookkeeping: JsonObject  # LangGraph's checkpoint without `channel_values`
    step: int  # nodes written so far (LangGraph's metadata `step`)

    @staticmethod
    def fresh(state: S, first: str) -> Checkpoint[S]:
        """Where a run that starts from its input stands before its first node."""
        bookkeeping: JsonObject = {"channel_versions": {TRIGGER + first: 1}, "versions_seen": {}}
        return Checkpoint(state, first, bookkeeping, 0)

    def with_state(self, state: T) -> Checkpoint[T]:
        """This checkpoint with `state` (the same state, read into its typed form)."""
        return Checkpoint(state, self.next_node, self.bookkeeping, self.step)

    def after(
        self,
        node: str,
        state: S,
        update: Iterable[str],
        next_node: str | None,
    ) -> Checkpoint[S]:
        """The checkpoint once `node` has updated the keys `update`, leaving `state`, and its
        edge chose `next_node`.

        The versions follow LangGraph's rules (a node sees its trigger's version; every channel
        written, and the trigger it consumed, moves to a new version), so the row stays a
        checkpoint LangGraph's own loop resumes: `tests/integration/graph/test_langgraph_resumes.py`
        fails when it no longer does.
        """
        versions: dict[str, Any] = dict(self.bookkeeping.get("channel_versions") or {})
        seen: dict[str, Any] = dict(self.bookkeeping.get("versions_seen") or {})
        version = max((v for v in versions.values() if isinstance(v, int)), default=0) + 1
        trigger = TRIGGER + node
        seen[node] = {trigger: versions.get(trigger, 0)}
        written = sorted(update)
        for channel in (*written, trigger):
            versions[channel] = version
        # Every key that holds a value has a version, as LangGraph's input step gives each key
        # of the input one: LangGraph leaves a channel without one out of what it writes.
        for key in state:
            versions.setdefault(key, version)
        # LangGraph's loop, resuming, considers only the nodes triggered by a channel in
        # `updated_channels`: the next node's trigger must be there, or it runs nothing.
        updated = written if next_node is None else sorted({*written, TRIGGER + next_node})
        if next_node is not None:
            versions[TRIGGER + next_node] = version
        return Checkpoint(
            state,
            next_node,
            {
                "v": FORMAT,
                "id": str(uuid6(clock_seq=self.step + 1)),
                "ts": datetime.now(UTC).isoformat(),
                "channel_versions": versions,
                "versions_seen": seen,
                "updated_channels": updated,
            },
            self.step + 1,
        )

    def stored(self) -> JsonObject:
        """The `checkpoint` column: the bookkeeping and the trigger of the next node."""
        values = {TRIGGER + self.next_node: None} if self.next_node is not None else {}
        return {**self.bookkeeping, "channel_values": values}


class RowCheckpointer:
    """Reads and writes the single `workflow_checkpoints` row of each task."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        state_keys: frozenset[str],
        context: EngineContext | None = None,
        upgrade: Upgrade = _as_is,
    ) -> None:
        self._pool = pool
        self._state_keys = state_keys
        self._upgrade = upgrade
        context = EngineContext() if context is None else context
        self._faults = context.faults
        self._secrets = context.secrets
        self._observers: list[WriteObserver] = []
        self._committer = GroupCommitter(pool, metrics=context.metrics)

    def observe(self, observer: WriteObserver) -> None:
        """Tell `observer` about every node's write from now on."""
        self._observers.append(observer)

    async def close(self) -> None:
        """Stop the group committer's flushers."""
        await self._committer.close()

    async def read(self, task_id: str, nodes: Iterable[str]) -> Checkpoint[JsonObject] | None:
        """The task's checkpoint (None: there is none yet), whose next node is one of `nodes`.

        Raises `OutsideWrite` when another writer changed the row, `UnreadableStateFormat`
        when a newer engine wrote it, `CheckpointCorrupt` when it is not a checkpoint this
        engine wrote. A row of an older state format is upgraded (`upgrade`). Its state is a
        JSON object, not yet checked against the state's form: the run does that (storage
        knows no graph).
        """

        async def read() -> tuple[Any, ...] | None:
            async with self._pool.connection() as conn:
                cur = await conn.execute(READ_CHECKPOINT, {"task_id": task_id})
                row: tuple[Any, ...] | None = await cur.fetchone()
                return row

        row = await with_retry(read)
        if row is not None and not row[4]:
            raise OutsideWrite(task_id)  # never resumed from blindly
        if row is None or row[1] is None:
            return None
        state, checkpoint_id, stored, metadata, _, state_format, engine_version = row
        if not readable(state_format):
            reason = unreadable_reason(state_format, engine_version, __version__)
            raise UnreadableStateFormat(task_id, reason)
        if state_format != STATE_FORMAT:
            state, stored = self._upgrade(state_format, task_id, state, stored)
        return _rebuild_checkpoint(task_id, state, checkpoint_id, stored, metadata, set(nodes))

    async def write(self, fence: Fence, checkpoint: Checkpoint[Any], event: JsonObject) -> None:
        """Write `checkpoint` as the row, with `event` (node, kind, detail, actor) in history.

        The state is written as it stands (its values are JSON), keeping the state's keys only.

        Raises `LeaseLost` when the fence no longer holds (nothing landed), `OutsideWrite`
        when another writer changed the row since.
        """
        state = {k: v for k, v in checkpoint.state.items() if k in self._state_keys}
        # The columns ListWorkflows and the watch show: the workflow's own secrets and the
        # engine's credentials masked, never another workflow's (`secrets.for_workflow`).
        masking = for_workflow(self._secrets, state_secrets(state))

        def masked(text: Any) -> str:
            return masking.redact(str(text or ""))

        node = str(event.get("node") or "")
        status = row_status(state)
        row = CheckpointRow(
            task_id=fence.task_id,
            holder_id=fence.holder_id,
            epoch=fence.epoch,
            run_id=fence.run_id,
            state=state,
            node=node,
            status=status,
            checkpoint_id=str(checkpoint.bookkeeping["id"]),
            checkpoint=checkpoint.stored(),
            metadata={"source": "loop", "step": checkpoint.step, "parents": {}},
            summary=masked(state.get("summary")),
            error=masked(state.get("error")),
            event_kind=str(event.get("kind") or "node"),
            detail=masked(event.get("detail")),
            actor=str(event.get("actor") or ""),
            release=status in FINAL_STATUSES,
            wake_at=wake_at(state),
        )

        async def write() -> WriteOutcome:
            self._faults.at("before", node)
            outcome = await self._committer.write(row)
            self._faults.at("after", node)  # committed, but the answer may be "lost"
            return outcome

        for observer in self._observers:
            observer.writing(fence.task_id)
        outcome: WriteOutcome | None = None
        try:
            outcome = await with_retry(write)
        finally:
            for observer in self._observers:
                observer.written(fence.task_id, outcome.events if outcome is not None else ())
        if outcome.written == "lost":
            raise LeaseLost(fence.task_id, fence.holder_id, fence.epoch)
        if outcome.written == "outside":
            raise OutsideWrite(fence.task_id)


def _rebuild_checkpoint(
    task_id: str, state: Any, checkpoint_id: str, stored: Any, metadata: Any, nodes: set[str]
) -> Checkpoint[JsonObject]:
    """Join the row's columns back into a checkpoint, refusing anything malformed."""
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
    # The node that runs next is the one whose trigger holds a value (LangGraph keeps a
    # consumed trigger's version, never its value).
    next_nodes = triggered(internal)
    if len(next_nodes) > 1 or not set(next_nodes) <= nodes:
        raise CheckpointCorrupt(
            f"task {task_id}: checkpoint triggers {sorted(next_nodes)}, not one node of the graph",
            task_id=task_id,
        )
    step = metadata.get("step") if isinstance(metadata, dict) else None
    return Checkpoint(
        state,
        next_nodes[0] if next_nodes else None,
        {k: v for k, v in stored.items() if k != "channel_values"},
        step if isinstance(step, int) else 0,
    )


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
