"""Request decoding that turns undecodable bytes into INVALID_ARGUMENT naming the field.

grpcio decodes requests before any servicer code runs, on the event loop, and a body it cannot
parse (say, a string field holding invalid UTF-8) comes back to the client as UNKNOWN. Here the
service's handlers are registered with a deserializer that only keeps the bytes (`deferred`):
`api._reading` decodes them once the caller is known, with one that never raises
(`lenient_deserializer`). It returns a `RefusedRequest` instead, which the servicer refuses
with the path of the offending field, found by walking the wire format against the message
descriptor.

Whoever can reach the port chooses the bytes, so naming the field is cheap and bounded: one
pass over the bytes without copying them, no deeper than protobuf itself goes, and at most
`DIAGNOSED_FIELDS` fields.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any, cast

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from workflow_engine.errors import InvalidArgument

#: Messages nested deeper than this are not entered: protobuf's own recursion limit, so a
#: request it refused for depth is named at the field where the depth runs out.
MAX_DEPTH = 100
#: Fields the walk reads before it gives up naming one (the request is then named as a
#: whole): a few milliseconds of the event loop, whatever the size and shape of the bytes.
DIAGNOSED_FIELDS = 2_000
#: Fields (tags on the wire, at any depth, JSON's and unknown ones included) one request may
#: hold, counted before protobuf decodes it (`too_many_fields`). Protobuf's decoding is C that
#: holds the interpreter for as long as it runs, whichever thread runs it: 4 MiB of small
#: fields took it 0.4 s on this project's 2 shared cores, this many 15 ms at most. A task of
#: 500 steps, each with 5 arguments, 5 variables and 3 checks, holds 16,000; one of 500 steps
#: of 64 checks each (every list at its limit) 97,500.
MAX_REQUEST_FIELDS = 100_000

Deserializer = Callable[[bytes], Any]


@dataclass(frozen=True, slots=True)
class RefusedRequest:
    """Stands in for a request refused before it was converted: bytes that did not parse, more
    than `MAX_REQUEST_FIELDS` fields, or a list longer than its limit (`api._limits`)."""

    field: str
    problem: str

    def error(self) -> InvalidArgument:
        return InvalidArgument(self.field, self.problem)


@dataclass(frozen=True, slots=True)
class Undecoded:
    """A request's bytes and the deserializer that has not run yet."""

    body: bytes
    decode: Deserializer

    def decoded(self) -> Any:
        return self.decode(self.body)


def deferred(decode: Deserializer) -> Deserializer:
    """A deserializer that only keeps the bytes, for `decode` to run when asked."""
    return lambda body: Undecoded(body, decode)


def lenient_deserializer(cls: type[Message]) -> Deserializer:
    """Decodes bytes into a `cls`, or a `RefusedRequest` naming why not: a field protobuf
    refuses, or more than `MAX_REQUEST_FIELDS` fields (counted first, in bodies that could
    hold that many: a field takes a byte at least)."""
    descriptor = cast(Descriptor, cls.DESCRIPTOR)

    def parse(data: bytes) -> Message | RefusedRequest:
        if len(data) > MAX_REQUEST_FIELDS:
            refused = too_many_fields(descriptor, data, MAX_REQUEST_FIELDS)
            if refused is not None:
                return refused
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            found = find_bad_field(descriptor, data)
            return found or RefusedRequest("request", f"cannot be decoded ({exc})")

    return parse


def too_many_fields(descriptor: Descriptor, data: bytes, most: int) -> RefusedRequest | None:
    """A refusal when `data` holds more than `most` fields, naming where they are (down to the
    first list, or JSON, on the way); None otherwise, and where the bytes are malformed
    (protobuf then refuses them, having read no further than this did).

    One pass by offsets, entering known message fields (so JSON's fields count), counting
    every tag; no string is copied or checked. Pure Python: where it runs in a thread, the
    event loop gets the interpreter back every switch interval.
    """
    view = memoryview(data)
    pos, end = 0, len(data)
    inside: list[tuple[int, Descriptor, _Child]] = []  # entered: (its parent's end, type, field)
    for _ in range(most):
        while pos >= end:
            if not inside:
                return None
            end, descriptor, _entered = inside.pop()
        key, pos = _varint(view, pos, end)
        wire = key & 7
        if wire == 2:
            length, pos = _varint(view, pos, end)
            if length < 0 or pos + length > end:
                return None
            child = _children(descriptor).get(key >> 3)
            if child is not None and len(inside) < MAX_DEPTH:
                inside.append((end, descriptor, child))
                descriptor, end = child.kind, pos + length
            else:
                pos += length
        elif wire == 0:
            value, pos = _varint(view, pos, end)
            if value < 0:
                return None
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
            if pos > end:
                return None
        elif key < 0 or wire not in (3, 4):  # 3, 4: a group's start or end, a tag alone
            return None
    while pos >= end and inside:
        end, descriptor, _entered = inside.pop()
    if pos >= end:
        return None  # exactly `most`
    return RefusedRequest(_where(inside, descriptor, view, pos, end), f"more than {most} fields")


@dataclass(frozen=True, slots=True)
class _Child:
    """A message field, as `too_many_fields` enters it."""

    name: str
    kind: Descriptor
    repeated: bool


@cache
def _children(descriptor: Descriptor) -> dict[int, _Child]:
    """Field number -> `_Child` for `descriptor`'s message fields (maps' entries included)."""
    return {
        field.number: _Child(field.name, field.message_type, field.is_repeated)
        for field in descriptor.fields
        if field.message_type is not None
    }


def _where(
    inside: list[tuple[int, Descriptor, _Child]],
    descriptor: Descriptor,
    view: memoryview,
    pos: int,
    end: int,
) -> str:
    """The path of the field at `pos`, down to the first list or JSON value on the way."""
    path = []
    for _end, parent, child in inside:
        if parent.full_name.startswith(_JSON):
            break
        path.append(child.name)
        if child.repeated:
            break
    else:
        number = _varint(view, pos, end)[0] >> 3
        field = descriptor.fields_by_number.get(number)
        if field is not None and not descriptor.full_name.startswith(_JSON):
            path.append(field.name)
    return ".".join(path) or "request"


_JSON = "google.protobuf."


def _varint(view: memoryview, pos: int, end: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it; -1 when it runs past `end` or 10 bytes."""
    if pos < end and view[pos] < 0x80:
        return view[pos], pos + 1  # most tags and lengths: one byte
    result = shift = 0
    while pos < end and shift < 64:
        byte = view[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    return -1, pos


def find_bad_field(descriptor: Descriptor, data: bytes) -> RefusedRequest | None:
    """The first string field that is not UTF-8, malformed wire data, or a message nested past
    `MAX_DEPTH`, by path; None if the first `DIAGNOSED_FIELDS` fields show none."""
    return _Walk(descriptor, data).run()


@dataclass(slots=True)
class _Frame:
    """A message the walk is inside: its type, where its bytes end, its path component."""

    descriptor: Descriptor
    end: int
    name: str
    seen: dict[int, int] = field(default_factory=dict)  # repeated field number -> count

    def component(self, number: int, known: FieldDescriptor | None) -> str:
        """The path component of the next field numbered `number` in this message."""
        if known is None:
            return f"<field {number}>"
        if not known.is_repeated:
            return known.name
        index = self.seen.get(number, 0)
        self.seen[number] = index + 1
        return f"{known.name}[{index}]"


class _Walk:
    """One pass over `data` by offsets, with a stack of the messages it is inside (no
    recursion, so no depth reaches Python's recursion limit; no slices, so nothing is
    copied)."""

    def __init__(self, descriptor: Descriptor, data: bytes) -> None:
        self.view = memoryview(data)
        self.pos = 0
        self.stack = [_Frame(descriptor, len(data), "")]

    def run(self) -> RefusedRequest | None:
        for _ in range(DIAGNOSED_FIELDS):
            while self.stack and self.pos >= self.stack[-1].end:
                self.stack.pop()  # the message ended: its parent's next field
            if not self.stack:
                return None
            found = self._field(self.stack[-1])
            if found is not None:
                return found
        return None

    def _field(self, frame: _Frame) -> RefusedRequest | None:
        key = self._varint(frame.end)
        if key is None:
            return self._bad(None, "truncated or malformed")
        number, wire = key >> 3, key & 7
        known = frame.descriptor.fields_by_number.get(number)
        name = frame.component(number, known)
        if wire == 2:
            length = self._varint(frame.end)
            if length is None or self.pos + length > frame.end:
                return self._bad(name, "truncated or malformed")
            return self._chunk(known, name, self.pos + length)
        if wire == 0:
            ends = self._varint(frame.end) is not None
        elif wire in (1, 5):
            self.pos += 8 if wire == 1 else 4
            ends = self.pos <= frame.end
        else:
            ends = False  # groups (3, 4) are not proto3; 6 and 7 are not wire types
        return None if ends else self._bad(name, "truncated or malformed")

    def _chunk(self, known: FieldDescriptor | None, name: str, end: int) -> RefusedRequest | None:
        """A length-delimited field ending at `end`: a message is entered, a string checked."""
        if known is not None and known.message_type is not None:
            if len(self.stack) > MAX_DEPTH:
                return self._bad(name, f"messages nested more than {MAX_DEPTH} deep")
            self.stack.append(_Frame(known.message_type, end, name))
            return None  # its fields are read next
        start, self.pos = self.pos, end
        if known is not None and known.type == FieldDescriptor.TYPE_STRING:
            try:
                str(self.view[start:end], "utf-8")
            except UnicodeDecodeError:
                return self._bad(name, "not UTF-8")
        return None

    def _varint(self, end: int) -> int | None:
        """The varint at `pos` (moving past it), or None if it runs past `end` or 10 bytes."""
        result = shift = 0
        pos = self.pos
        while pos < end and shift < 64:
            byte = self.view[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                self.pos = pos
                return result
            shift += 7
        return None

    def _bad(self, name: str | None, problem: str) -> RefusedRequest:
        path = [frame.name for frame in self.stack[1:]]
        if name is not None:
            path.append(name)
        return RefusedRequest(".".join(path) or "request", f"cannot be decoded: {problem}")


def generic_handler(
    service: ServiceDescriptor, servicer: object
) -> grpc.GenericRpcHandler[Any, Any]:
    """Handlers for every method of `service` on `servicer`, keeping each request's bytes for
    `api._reading` to decode (leniently)."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=deferred(lenient_deserializer(request)),
            response_serializer=response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)
