"""The status names and sets every layer shares, and the domain's place below those layers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import workflow_engine.domain
from workflow_engine.domain.status import (
    FINAL_STATUSES,
    PAUSED_STATUSES,
    TERMINAL_STATUSES,
    WorkflowStatus,
)
from workflow_engine.v1 import workflow_engine_pb2 as pb


def test_members_are_the_stored_strings_and_the_proto_names() -> None:
    for status in WorkflowStatus:
        assert status == status.name
        assert hash(status) == hash(status.name)  # set membership of a stored string
        assert pb.WorkflowStatus.Name(pb.WorkflowStatus.Value(status)) == status.name
    names = set(pb.WorkflowStatus.keys()) - {"WORKFLOW_STATUS_UNSPECIFIED"}
    assert {status.name for status in WorkflowStatus} == names


def test_sets() -> None:
    assert {"SUCCEEDED", "FAILED", "CANCELLED"} == TERMINAL_STATUSES
    assert {"WAITING_FOR_APPROVAL", "SUSPENDED"} == PAUSED_STATUSES
    assert FINAL_STATUSES == TERMINAL_STATUSES | PAUSED_STATUSES
    assert "RUNNING" not in FINAL_STATUSES
    # Plain strings, as stored: whatever iterates a set sees what a row holds.
    assert all(type(name) is str for name in FINAL_STATUSES)


def test_domain_imports_no_layer_above_it() -> None:
    above = ("storage", "runtime", "api", "graph", "capabilities", "service", "app")
    for module in Path(workflow_engine.domain.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.ImportFrom):
                # `from ..storage import x` (level 2) leaves the domain package too.
                prefix = "workflow_engine." if node.level >= 2 else ""
                names = [prefix + (node.module or "")]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                assert not (parts[0] == "workflow_engine" and parts[1:2] and parts[1] in above), (
                    f"{module.name} imports {name}"
                )


def test_the_state_spelling_converts_both_ways() -> None:
    for status in WorkflowStatus:
        assert WorkflowStatus.of_state(status.in_state) is status
    assert WorkflowStatus.of_state(None) is WorkflowStatus.RUNNING  # a state not yet loaded
    assert WorkflowStatus.of_state("waiting_for_approval") == "WAITING_FOR_APPROVAL"
    for unknown in ("RUNNING", "done", 3):
        with pytest.raises(ValueError, match="unknown workflow status"):
            WorkflowStatus.of_state(unknown)
