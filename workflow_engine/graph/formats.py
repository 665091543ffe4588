"""The state formats this engine reads, and the upgrade from each to the next.

A state format is everything a stored checkpoint means: the state's form (`graph.state`), the
graph's node names, and the next-node trigger LangGraph's bookkeeping holds
(``branch:to:<node>``). Any change to one of them is a new format: `STATE_FORMAT` grows by one,
`NODES` gets the new format's nodes, and `UPGRADES` a function from the format before, which
rewrites a stored row of that format into the new one (a renamed or removed node is mapped to
the node that now does its work, with `renamed_nodes`; nothing is guessed). Rows are upgraded
as a run reads them (`upgrade`, given to the checkpointer); the upgraded row is written back in
the new format with the run's next node. `tests/unit/graph/test_formats.py` fails when the
state's form or the graph changes without a new format.

The formats so far:

1. Every row written before rows recorded a format (the engine up to 0.1.0, including rows
   written by LangGraph's own loop): the state of `graph.state`, whose keys may be missing in
   rows of older engines, and the eight nodes below.
2. The same state and nodes, in a row that records its format and its engine: the upgrade from
   1 passes the state as it is and checks the trigger against format 1's nodes.
3. Approval timeouts (issue 52): the state gains the task's defaults
   (`approval_timeout_seconds`, `on_approval_timeout`), why a wait ended SUSPENDED
   (`wait_expired`), and the pending request its expiry (`expires_at`, `on_timeout`,
   `timeout_seconds`, `timeout_action`). Every new key may be missing, and means "never
   expires" then: the upgrade from 2 passes the state as it is (a request made by a format 2
   engine still expires at the workflow's deadline, once a checkpoint of format 3 is written).
4. Runs of their own (issue 61): the state names its run (`run_id`), and the job ids of a
   workflow with one are its run's (`graph._nodes.job_id_for`), as are its jobs' user and /tmp.
   An engine of format 3 would give the jobs of such a workflow the task's ids again (and so a
   job in flight a second id), which is why it is a new format. The upgrade from 3 passes the
   state as it is: with no `run_id`, its jobs keep the task's ids, so a job in flight is found
   under the id it was started with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from workflow_engine.domain.state_format import FIRST_STATE_FORMAT, STATE_FORMAT, TRIGGER, triggered
from workflow_engine.domain.values import JsonObject
from workflow_engine.errors import CheckpointCorrupt

_NODES_1_AND_2 = frozenset(
    {
        "load_task_context",
        "plan_steps",
        "dispatch_step",
        "collect_result",
        "verify_step_result",
        "finalize_summary",
        "mark_failed",
        "suspend_workflow",
    }
)

#: The graph's node names in each format.
NODES: Mapping[int, frozenset[str]] = {
    1: _NODES_1_AND_2,
    2: _NODES_1_AND_2,
    3: _NODES_1_AND_2,
    4: _NODES_1_AND_2,
}


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A row's checkpoint as stored: its `state` column and its `checkpoint` column
    (LangGraph's bookkeeping, whose ``channel_values`` hold the next node's trigger)."""

    task_id: str
    state: JsonObject
    checkpoint: JsonObject


Upgrade = Callable[[StoredCheckpoint], StoredCheckpoint]


def from_format_1(row: StoredCheckpoint) -> StoredCheckpoint:
    """Format 1 to 2: the state and the nodes are the same; a trigger of a node format 1 never
    had is refused, not carried over."""
    check_trigger(row, 1)
    return row


def from_format_2(row: StoredCheckpoint) -> StoredCheckpoint:
    """Format 2 to 3: only keys were added, each optional; the nodes are the same."""
    check_trigger(row, 2)
    return row


def from_format_3(row: StoredCheckpoint) -> StoredCheckpoint:
    """Format 3 to 4: `run_id` stays missing (the workflow's job ids stay its task's); the
    nodes are the same."""
    check_trigger(row, 3)
    return row


#: The upgrade from each format to the next one, by the format it reads.
UPGRADES: Mapping[int, Upgrade] = {1: from_format_1, 2: from_format_2, 3: from_format_3}


def upgrade(state_format: int, task_id: str, state: Any, checkpoint: Any) -> tuple[Any, Any]:
    """A stored row of `state_format` as this engine's format, one upgrade at a time.

    Values that are not JSON objects are passed on as they are: the checkpointer refuses them
    (`CheckpointCorrupt`) with its own words."""
    if not (isinstance(state, dict) and isinstance(checkpoint, dict)):
        return state, checkpoint
    row = StoredCheckpoint(task_id, state, checkpoint)
    for step in range(max(state_format, FIRST_STATE_FORMAT), STATE_FORMAT):
        row = UPGRADES[step](row)
    return row.state, row.checkpoint


def check_trigger(row: StoredCheckpoint, state_format: int) -> None:
    """`CheckpointCorrupt` unless the row's next-node trigger (if any) names a node of
    `state_format`."""
    values = row.checkpoint.get("channel_values")
    unknown = sorted(set(triggered(values or {})) - NODES[state_format])
    if unknown:
        raise CheckpointCorrupt(
            f"task {row.task_id}: the checkpoint triggers {unknown}, which state format "
            f"{state_format} has no node of",
            task_id=row.task_id,
        )


def renamed_nodes(row: StoredCheckpoint, renames: Mapping[str, str]) -> StoredCheckpoint:
    """`row` with each node `old` of `renames` called `new` in its bookkeeping: the trigger,
    the channel versions and the versions each node has seen. For an upgrade whose format
    renames a node, or removes one (mapped to the node that now does its work)."""

    def channel(name: str) -> str:
        if name.startswith(TRIGGER):
            node = name[len(TRIGGER) :]
            return TRIGGER + renames.get(node, node)
        return name

    stored = row.checkpoint
    values = stored.get("channel_values")
    versions = stored.get("channel_versions")
    seen = stored.get("versions_seen")
    checkpoint: JsonObject = dict(stored)
    if isinstance(values, dict):
        checkpoint["channel_values"] = {channel(k): v for k, v in values.items()}
    if isinstance(versions, dict):
        checkpoint["channel_versions"] = {channel(k): v for k, v in versions.items()}
    if isinstance(seen, dict):
        checkpoint["versions_seen"] = {
            renames.get(node, node): (
                {channel(k): v for k, v in by.items()} if isinstance(by, dict) else by
            )
            for node, by in seen.items()
        }
    return replace(row, checkpoint=checkpoint)
