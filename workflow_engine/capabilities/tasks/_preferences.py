"""Preference layers (defaults, user, project, task) folded into the one mapping a run uses."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any


def merge_preferences(layers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Deep-merge `layers` in order, later layers winning.

    Nested mappings merge key by key; any other value (lists included) replaces what was there,
    because merging lists element-wise has no meaning a user could predict. The inputs are not
    mutated and the result shares no mutable values with them.
    """
    merged: dict[str, Any] = {}
    for layer in layers:
        _merge_into(merged, layer)
    return merged


def _merge_into(target: dict[str, Any], layer: Mapping[str, Any]) -> None:
    for key, value in layer.items():
        current = target.get(key)
        if isinstance(value, Mapping) and isinstance(current, dict):
            _merge_into(current, value)
        elif isinstance(value, Mapping):
            fresh: dict[str, Any] = {}
            _merge_into(fresh, value)
            target[key] = fresh
        else:
            target[key] = copy.deepcopy(value)


def node_preferences(effective: Mapping[str, Any]) -> tuple[str, ...]:
    """The node labels a task's effective preferences ask for (seed: data locality, models).

    ``locality: "eu-west"`` asks for ``locality=eu-west``, ``model: "llama3"`` for
    ``models=llama3`` (the keys of a nodes file's label map), and ``node_labels`` (a list)
    for its labels as they are. Only a tie-breaker between equally loaded nodes: a node without
    them still runs the job. Anything else, or another type, is ignored.
    """
    wanted: list[str] = []
    for key, label_key in (("locality", "locality"), ("model", "models")):
        value = effective.get(key)
        if isinstance(value, str) and value:
            wanted.append(f"{label_key}={value}")
    extra = effective.get("node_labels")
    if isinstance(extra, list):
        wanted += [str(label) for label in extra if isinstance(label, str) and label]
    return tuple(dict.fromkeys(wanted))
