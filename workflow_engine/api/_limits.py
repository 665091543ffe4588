"""How many elements each list and map of a request may hold, counted on the decoded message
before anything is converted.

Converting costs per element (a step is validated in some 50 microseconds), so a request is
counted first: `len()` of a protobuf list or map is free, and one over its limit is refused as
INVALID_ARGUMENT naming the field and the limit before any of its elements is read. `COUNTED`
is the one table of those limits, by proto field; the numbers are the domain model's (which
counts a task sent as JSON the same way) and the request parsers'. JSON (`Struct`, `Value`)
has no limit list by list: its shape is the caller's.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any, cast

from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from workflow_engine.api._listing import MAX_STATUSES
from workflow_engine.api._requests import MAX_EVENT_KINDS, MAX_SET_STATE_KEYS
from workflow_engine.domain.task import (
    MAX_ARGV,
    MAX_CHECKS,
    MAX_CRITERIA,
    MAX_DEPENDS_ON,
    MAX_ENV,
    MAX_LABELS,
    MAX_METADATA_LABELS,
    MAX_PREFERENCES,
    MAX_SECRET_ENV,
    MAX_STEPS,
)
from workflow_engine.errors import InvalidArgument

_V1 = "workflow_engine.v1."
#: Proto field -> (most elements, what they are called). A `Struct` field's limit is on its keys.
COUNTED: Mapping[str, tuple[int, str]] = {
    _V1 + "TaskSpec.steps": (MAX_STEPS, "steps"),
    _V1 + "TaskSpec.acceptance_criteria": (MAX_CRITERIA, "acceptance criteria"),
    _V1 + "TaskSpec.preferences": (MAX_PREFERENCES, "preference layers"),
    _V1 + "TaskMetadata.labels": (MAX_METADATA_LABELS, "labels"),
    _V1 + "Step.command": (MAX_ARGV, "arguments"),
    _V1 + "Step.env": (MAX_ENV, "variables"),
    _V1 + "Step.depends_on": (MAX_DEPENDS_ON, "dependencies"),
    _V1 + "Step.expect": (MAX_CHECKS, "checks"),
    _V1 + "Step.required_labels": (MAX_LABELS, "labels"),
    _V1 + "Step.secret_env": (MAX_SECRET_ENV, "secret variables"),
    _V1 + "ApprovalDecision.command": (MAX_ARGV, "arguments"),
    _V1 + "ApprovalDecision.env": (MAX_ENV, "variables"),
    _V1 + "ListWorkflowsRequest.statuses": (MAX_STATUSES, "statuses"),
    _V1 + "WatchWorkflowRequest.kinds": (MAX_EVENT_KINDS, "kinds"),
    _V1 + "UpdateWorkflowRequest.set_state": (MAX_SET_STATE_KEYS, "fields"),
    # A schedule has seven fields one may replace; a mask naming each twice is still small.
    _V1 + "UpdateScheduleRequest.update_mask": (16, "field names"),
}
#: JSON's lists and objects: no limit of their own (a JSON value is weighed by its bytes).
JSON_LISTS = frozenset({"google.protobuf.Struct.fields", "google.protobuf.ListValue.values"})


class _Enough(Exception):
    """Counting stopped: more elements than asked to count."""


def counted(message: Message, *, stop_after: int | None = None) -> int | None:
    """How many elements `message`'s lists and maps hold in all, once each is within its limit
    in `COUNTED`; `InvalidArgument` for the first that is not.

    A JSON value is not entered: it counts as the most elements its bytes can hold (one in
    `JSON_BYTES`). With `stop_after`, counting stops (None) once more elements than that are
    counted, leaving the rest unchecked: a caller that only needs to know a request is small.
    """
    total = [0]
    try:
        _count(message, None, total, stop_after)
    except _Enough:
        return None
    return total[0]


#: Bytes a JSON element takes at least on the wire (``null`` in a list: a tag, a length, a tag
#: and a zero), so a JSON value of n bytes holds at most n / JSON_BYTES elements.
JSON_BYTES = 4
_JSON = frozenset({"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"})
#: What the walk does with a field: count a list (entering its elements when `enter`), a map,
#: or a list of JSON values (by their bytes); enter a message; weigh a JSON value.
_LIST, _MAP, _JSON_LIST, _MESSAGE, _JSON_VALUE = 1, 2, 3, 4, 5
#: (name, what the walk does, its limit in `COUNTED`, whether its elements are entered)
_Field = tuple[str, int, tuple[int, str] | None, bool]


def _count(message: Message, path: Any, total: list[int], most: int | None) -> None:
    """Count `message`'s lists into `total[0]`; `path` is where it is, as nested pairs
    (parent, name or index), joined only when a limit is exceeded."""
    for name, kind, limit, enter in _fields(type(message)):
        if kind >= _MESSAGE:  # a singular message
            if not message.HasField(name):
                continue
            value = getattr(message, name)
            if limit is not None and len(value.fields) > limit[0]:
                _refuse((path, name), limit)
            if kind == _MESSAGE:
                _count(value, (path, name), total, most)
                continue
            total[0] += value.ByteSize() // JSON_BYTES
        else:
            value = getattr(message, name)
            if not value:
                continue
            if limit is not None and len(value) > limit[0]:
                _refuse((path, name), limit)
            total[0] += len(value)
            if kind == _JSON_LIST:
                total[0] += sum(item.ByteSize() for item in value) // JSON_BYTES
            elif enter:
                items = value.items() if kind == _MAP else enumerate(value)
                for key, item in items:
                    _count(item, ((path, name), key), total, most)
        if most is not None and total[0] > most:
            raise _Enough


def _refuse(path: Any, limit: tuple[int, str]) -> None:
    """``task.steps[3].env: more than ...`` from (((((), "task"), "steps"), 3), "env")."""
    parts = []
    while path:
        path, part = path
        parts.append(part)
    text = ""
    for part in reversed(parts):
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    raise InvalidArgument(text, f"more than {limit[0]} {limit[1]}")


_FIELDS: dict[type, tuple[_Field, ...]] = {}


def _fields(kind: type[Message]) -> tuple[_Field, ...]:
    """The fields of `kind`'s messages that the walk looks at (worked out once a type)."""
    known = _FIELDS.get(kind)
    if known is None:
        known = _FIELDS[kind] = tuple(_looked_at(cast(Descriptor, kind.DESCRIPTOR)))
    return known


def _looked_at(descriptor: Descriptor) -> list[_Field]:
    fields: list[_Field] = []
    for field in descriptor.fields:
        limit = COUNTED.get(field.full_name)
        inner: Descriptor | None = field.message_type
        if inner is not None and inner.GetOptions().map_entry:
            value = inner.fields_by_name["value"].message_type
            fields.append((field.name, _MAP, limit, value is not None and _holds(value)))
        elif inner is not None and inner.full_name in _JSON:
            fields.append(
                (field.name, _JSON_LIST if field.is_repeated else _JSON_VALUE, limit, False)
            )
        elif field.is_repeated:
            fields.append((field.name, _LIST, limit, inner is not None and _holds(inner)))
        elif inner is not None and _holds(inner):
            fields.append((field.name, _MESSAGE, limit, True))
    return fields


@cache
def _holds(descriptor: Descriptor) -> bool:
    """Whether messages of `descriptor`'s type can hold a list, a map or JSON, at any depth."""
    if descriptor.full_name in _JSON:
        return True
    return any(
        field.is_repeated or (field.message_type is not None and _holds(field.message_type))
        for field in descriptor.fields
    )
