"""State formats: this engine's format is what its graph and state are, and each older format
has its upgrade.

`test_the_current_format_is_what_the_code_writes` is the guard: change the state's form (a key,
a type, a record) or the graph's nodes and it fails until `STATE_FORMAT` grows, `NODES` and
`UPGRADES` (graph/formats.py) say what the new format is and how a row of the one before
becomes one of it, and the fingerprint below is the new one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from workflow_engine.domain.state_format import (
    FIRST_STATE_FORMAT,
    STATE_FORMAT,
    readable,
    unreadable_reason,
)
from workflow_engine.errors import CheckpointCorrupt
from workflow_engine.graph import formats
from workflow_engine.graph._builder import EDGES
from workflow_engine.graph.formats import StoredCheckpoint, renamed_nodes, upgrade
from workflow_engine.graph.state import STATE

#: The state's form (its JSON schema without titles and descriptions) in each format.
FINGERPRINTS = {2: "e85d95b16237fab4", 3: "840842585b92c287", 4: "c7a8aa1c83374388"}

STATES = Path(__file__).parent / "fixtures" / "states_c4739ac.json"


def fingerprint() -> str:
    def bare(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: bare(v) for k, v in value.items() if k not in ("title", "description")}
        if isinstance(value, list):
            return [bare(v) for v in value]
        return value

    schema = json.dumps(bare(STATE.json_schema()), sort_keys=True)
    return hashlib.sha256(schema.encode()).hexdigest()[:16]


def test_the_current_format_is_what_the_code_writes() -> None:
    assert set(EDGES) == formats.NODES[STATE_FORMAT], (
        "the graph's nodes changed: that is a new state format (see graph/formats.py)"
    )
    assert fingerprint() == FINGERPRINTS[STATE_FORMAT], (
        "the state's form changed: that is a new state format (see graph/formats.py); "
        f"its fingerprint is {fingerprint()}"
    )


def test_every_older_format_has_an_upgrade_to_the_next() -> None:
    assert sorted(formats.UPGRADES) == list(range(FIRST_STATE_FORMAT, STATE_FORMAT))
    assert sorted(formats.NODES) == list(range(FIRST_STATE_FORMAT, STATE_FORMAT + 1))


def checkpoint(next_node: str | None) -> dict[str, Any]:
    values = {f"branch:to:{next_node}": None} if next_node else {}
    return {
        "v": 4,
        "id": "1",
        "channel_values": values,
        "channel_versions": {"branch:to:plan_steps": 2, "plan": 2},
        "versions_seen": {"plan_steps": {"branch:to:plan_steps": 1}},
    }


def test_a_format_1_row_reads_as_it_was_written() -> None:
    """The states an engine before formats wrote (captured from commit c4739ac)."""
    for state in json.loads(STATES.read_text()).values():
        stored = checkpoint("dispatch_step")
        assert upgrade(1, "t", state, stored) == (state, stored)


def test_a_format_1_row_triggering_a_node_format_1_never_had_is_refused() -> None:
    with pytest.raises(CheckpointCorrupt, match=r"\['deploy_everything'\].*state format 1"):
        upgrade(1, "t", {}, checkpoint("deploy_everything"))


def test_rows_of_this_format_are_not_touched() -> None:
    stored = checkpoint("no_such_node")  # not checked here: the checkpointer refuses it
    assert upgrade(STATE_FORMAT, "t", {"a": 1}, stored) == ({"a": 1}, stored)


def test_a_renamed_node_is_renamed_everywhere_in_the_bookkeeping() -> None:
    row = StoredCheckpoint("t", {}, checkpoint("plan_steps"))
    renamed = renamed_nodes(row, {"plan_steps": "make_plan"}).checkpoint
    assert renamed["channel_values"] == {"branch:to:make_plan": None}
    assert renamed["channel_versions"] == {"branch:to:make_plan": 2, "plan": 2}
    assert renamed["versions_seen"] == {"make_plan": {"branch:to:make_plan": 1}}
    assert row.checkpoint == checkpoint("plan_steps")  # the row read is not changed


def test_upgrades_run_one_format_at_a_time_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A future format 3 that renames a node: a format-1 row goes 1 -> 2 -> 3."""
    steps: list[int] = []

    def to_3(row: StoredCheckpoint) -> StoredCheckpoint:
        steps.append(2)
        formats.check_trigger(row, 2)
        return renamed_nodes(row, {"plan_steps": "make_plan"})

    def to_2(row: StoredCheckpoint) -> StoredCheckpoint:
        steps.append(1)
        return formats.from_format_1(row)

    monkeypatch.setattr(formats, "STATE_FORMAT", 3)
    monkeypatch.setattr(formats, "UPGRADES", {1: to_2, 2: to_3})
    _, stored = upgrade(1, "t", {}, checkpoint("plan_steps"))
    assert steps == [1, 2]
    assert stored["channel_values"] == {"branch:to:make_plan": None}


def test_which_formats_this_engine_reads() -> None:
    assert [f for f in range(-1, STATE_FORMAT + 3) if readable(f)] == list(
        range(FIRST_STATE_FORMAT, STATE_FORMAT + 1)
    )
    assert unreadable_reason(STATE_FORMAT, "x", "y") == ""
    said = unreadable_reason(STATE_FORMAT + 1, "9.0.0", "1.0.0")
    assert f"engine 9.0.0 in state format {STATE_FORMAT + 1}" in said
    assert f"engine (1.0.0) reads formats {FIRST_STATE_FORMAT} to {STATE_FORMAT}" in said
    assert "an unknown engine" in unreadable_reason(STATE_FORMAT + 1, "", "1.0.0")
