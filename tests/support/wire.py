"""Protobuf wire bytes built by hand, for requests that protobuf refuses to encode (nested past
its depth limit) or that no encoder would write (truncated, not UTF-8)."""

from __future__ import annotations

import uuid


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append(n & 0x7F | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def head(number: int, length: int) -> bytes:
    """The tag and length of a length-delimited field (wire type 2): what precedes its bytes."""
    return varint(number << 3 | 2) + varint(length)


def field(number: int, payload: bytes) -> bytes:
    """One length-delimited field: a string, bytes or a message."""
    return head(number, len(payload)) + payload


def nested_struct(levels: int, bottom: bytes = b"") -> bytes:
    """A `google.protobuf.Struct` nested `levels` deep ({"x": {"x": ...}}) whose innermost
    Struct holds `bottom` as a string value.

    Each level is only a prefix before the level inside it, so the prefixes are worked out from
    the lengths and joined once: concatenating level by level would copy the inside each time.
    """
    inside = field(1, field(1, b"x") + field(2, field(3, bottom)))  # {"x": "<bottom>"}
    prefixes = []
    size = len(inside)
    for _ in range(levels):
        value = head(5, size)  # Value.struct_value
        entry = field(1, b"x") + head(2, len(value) + size)  # Struct.fields entry {x: value}
        prefix = head(1, len(entry) + len(value) + size) + entry + value
        prefixes.append(prefix)
        size += len(prefix)
    return b"".join(reversed(prefixes)) + inside


def deep_update(levels: int = 300, size: int = 3_500_000) -> bytes:
    """An UpdateWorkflowRequest whose `set_state` nests `levels` deep, with `size` bytes at the
    bottom: the bulk of the request is inside every level."""
    head = field(1, str(uuid.uuid4()).encode()) + field(2, b"attacker")
    return head + field(4, nested_struct(levels, b"A" * size))
