"""Request decoding that turns undecodable bytes into INVALID_ARGUMENT naming the field.

grpcio decodes requests before any servicer code runs, and a body it cannot parse (say, a
string field holding invalid UTF-8) comes back to the client as UNKNOWN. Here the service's
handlers are registered with a deserializer that never raises: it returns an
`UndecodableRequest` instead, which the servicer refuses with the path of the offending field,
found by walking the wire format against the message descriptor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from workflow_engine.errors import InvalidArgument


@dataclass(frozen=True, slots=True)
class UndecodableRequest:
    """Stands in for a request whose bytes did not parse."""

    field: str
    problem: str

    def error(self) -> InvalidArgument:
        return InvalidArgument(self.field, self.problem)


def lenient_deserializer(cls: type[Message]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Message | UndecodableRequest:
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            field = find_bad_field(cast(Descriptor, cls.DESCRIPTOR), data) or "request"
            return UndecodableRequest(field, f"cannot be decoded ({exc})")

    return parse


def find_bad_field(descriptor: Descriptor, data: bytes, prefix: str = "") -> str | None:
    """The path of the first string field that is not UTF-8, or of malformed wire data."""
    pos = 0
    counts: dict[int, int] = {}
    name = prefix.rstrip(".") or "request"
    try:
        while pos < len(data):
            key, pos = _varint(data, pos)
            number, wire = key >> 3, key & 7
            field = descriptor.fields_by_number.get(number)
            name = f"{prefix}{field.name}" if field else f"{prefix}<field {number}>"
            if field is not None and field.is_repeated:
                index = counts.get(number, 0)
                counts[number] = index + 1
                name = f"{name}[{index}]"
            if wire == 0:
                _, pos = _varint(data, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            elif wire == 2:
                length, pos = _varint(data, pos)
                chunk, pos = data[pos : pos + length], pos + length
                if len(chunk) != length:
                    return name
                if field is None:
                    continue
                if field.type == FieldDescriptor.TYPE_STRING:
                    chunk.decode("utf-8")
                elif field.message_type is not None:
                    found = find_bad_field(field.message_type, chunk, name + ".")
                    if found:
                        return found
            else:
                return name
            if pos > len(data):
                return name
    except UnicodeDecodeError:
        return name
    except IndexError:
        return prefix.rstrip(".") or None
    return None


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def generic_handler(
    service: ServiceDescriptor, servicer: object
) -> grpc.GenericRpcHandler[Any, Any]:
    """Handlers for every method of `service` on `servicer`, decoding requests leniently."""
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
            request_deserializer=lenient_deserializer(request),
            response_serializer=response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)
