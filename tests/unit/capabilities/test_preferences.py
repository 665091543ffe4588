"""Preference layers merge deeply, later layers win, and nothing given is changed."""

from __future__ import annotations

import copy
from typing import Any

from workflow_engine.capabilities.tasks import merge_preferences


def test_no_layers_is_empty() -> None:
    assert merge_preferences([]) == {}


def test_later_scalar_wins() -> None:
    assert merge_preferences([{"a": 1, "b": 2}, {"a": 3}]) == {"a": 3, "b": 2}


def test_nested_mappings_merge_recursively() -> None:
    layers: list[dict[str, Any]] = [
        {"style": {"lint": {"line": 80, "strict": True}, "tabs": False}},
        {"style": {"lint": {"line": 100}}},
        {"style": {"extra": "x"}},
    ]
    assert merge_preferences(layers) == {
        "style": {"lint": {"line": 100, "strict": True}, "tabs": False, "extra": "x"}
    }


def test_lists_replace_instead_of_concatenating() -> None:
    assert merge_preferences([{"tags": [1, 2]}, {"tags": [3]}]) == {"tags": [3]}


def test_a_scalar_replaces_a_mapping_and_back() -> None:
    assert merge_preferences([{"a": {"b": 1}}, {"a": 2}]) == {"a": 2}
    assert merge_preferences([{"a": 2}, {"a": {"b": 1}}]) == {"a": {"b": 1}}


def test_inputs_are_not_mutated_or_shared() -> None:
    first = {"a": {"b": [1, 2]}, "c": 1}
    second = {"a": {"d": {"e": 1}}}
    before = copy.deepcopy([first, second])

    merged = merge_preferences([first, second])
    merged["a"]["b"].append(3)
    merged["a"]["d"]["e"] = 99

    assert [first, second] == before
