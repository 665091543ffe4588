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
