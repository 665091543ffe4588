"""Naming the field of undecodable bytes costs little whatever the bytes, and nothing at all
before the caller is known (issue 48, finding 3)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from tests.support.wire import deep_update, field, varint
from workflow_engine.api import Authenticator, AuthInterceptor, Callers, RequestReader
from workflow_engine.api._decoding import (
    MAX_REQUEST_FIELDS,
    RefusedRequest,
    Undecoded,
    generic_handler,
    lenient_deserializer,
)
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

NOT_UTF8 = field(1, b"\xff\xfe")  # task_id


def naming(cls: type[Any], body: bytes) -> RefusedRequest:
    found = lenient_deserializer(cls)(body)
    assert isinstance(found, RefusedRequest), found
    return found


@pytest.mark.parametrize(
    ("body", "path", "problem"),
    [
        (NOT_UTF8 + field(3, b"why"), "task_id", "not UTF-8"),
        (field(4, field(1, field(1, b"k") + field(2, field(3, b"\xff")))), "set_state", "UTF-8"),
        (field(3, b"why")[:-1], "reason", "truncated"),
        (deep_update(300, size=1), "set_state.fields[0].value.struct_value.", "nested"),
    ],
)
def test_the_bad_field_is_named(body: bytes, path: str, problem: str) -> None:
    found = naming(pb.UpdateWorkflowRequest, body)
    assert found.field.startswith(path) and problem in found.problem, found


# The shapes that made the walk expensive: depth times size (each level copied the rest),
# depth alone (recursion ran out of stack: UNKNOWN), breadth (one step per field: seconds).
COSTLY = {
    "3.5 MB inside 300 levels": (pb.UpdateWorkflowRequest, deep_update(300)),
    "20,000 levels": (pb.UpdateWorkflowRequest, deep_update(20_000, size=1)),
    "2,000,000 fields, then one not UTF-8": (
        pb.StartWorkflowRequest,
        (varint(5 << 3) + b"\x01") * 2_000_000 + NOT_UTF8,  # lease_ttl_seconds, repeated
    ),
}


@pytest.mark.timing
@pytest.mark.parametrize("shape", sorted(COSTLY))
def test_naming_the_field_is_bounded(shape: str) -> None:
    cls, body = COSTLY[shape]
    started = time.perf_counter()
    found = naming(cls, body)
    took = time.perf_counter() - started
    print(f"{shape}: {took * 1000:.1f} ms, {found.field[:40]}")
    assert took < 0.2  # protobuf's parse and the walk: tens of milliseconds; seconds before


def keys(count: int) -> bytes:
    """A Struct of `count` distinct keys, each null: the costliest shape to decode."""
    return b"".join(
        field(1, field(1, str(i).encode()) + field(2, b"\x08\x00")) for i in range(count)
    )


NULLS = field(1, field(1, b"a") + field(2, field(6, field(1, b"\x08\x00") * 1_000_000)))
#: 4 MiB of small fields: protobuf took up to 0.4 s to decode one, holding the interpreter.
MANY = {
    "steps": (pb.StartWorkflowRequest, field(4, field(3, b"") * 2_000_000), "task.steps"),
    "set_state keys": (pb.UpdateWorkflowRequest, field(4, keys(350_000)), "set_state"),
    "a preference's list": (pb.StartWorkflowRequest, field(4, field(4, NULLS)), "task.preferences"),
    "one step's env": (
        pb.StartWorkflowRequest,
        field(4, field(3, field(1, b"s") + field(4, b"") * 2_000_000)),
        "task.steps",
    ),
    "statuses, unpacked": (pb.ListWorkflowsRequest, b"\x08\x01" * 2_000_000, "statuses"),
    "unknown groups": (
        pb.GetWorkflowRequest,
        (varint(99 << 3 | 3) + varint(99 << 3 | 4)) * 2_000_000,
        "request",
    ),
}


@pytest.mark.timing
@pytest.mark.parametrize("shape", sorted(MANY))
def test_too_many_fields_are_refused_before_protobuf_decodes_them(shape: str) -> None:
    cls, body, path = MANY[shape]
    started = time.perf_counter()
    found = naming(cls, body)
    took = time.perf_counter() - started
    print(f"{shape}: {took * 1000:.1f} ms")
    assert (found.field, found.problem) == (path, f"more than {MAX_REQUEST_FIELDS} fields")
    assert took < 0.5  # counting stops at the limit: about 0.1 s of Python, not of protobuf


def test_up_to_the_most_fields_a_request_decodes() -> None:
    decode = lenient_deserializer(pb.ListWorkflowsRequest)
    assert len(decode(b"\x08\x01" * MAX_REQUEST_FIELDS).statuses) == MAX_REQUEST_FIELDS
    assert isinstance(decode(b"\x08\x01" * (MAX_REQUEST_FIELDS + 1)), RefusedRequest)


@dataclass(frozen=True)
class Details:
    """What grpcio tells an interceptor about a call before its request is read."""

    method: str
    invocation_metadata: tuple[tuple[str, str], ...] = ()


async def test_nothing_is_decoded_before_the_caller_is_known() -> None:
    """grpcio runs a handler's deserializer before any interceptor's behaviour: the one the
    service's handlers (and so the auth interceptor's) hand grpcio only keeps the bytes; they
    are read after `identify`."""
    service = pb.DESCRIPTOR.services_by_name["WorkflowEngine"]
    handlers = generic_handler(service, pb_grpc.WorkflowEngineServicer())
    authenticator = Authenticator(Callers([], {}), False)
    interceptor = AuthInterceptor(authenticator, service.full_name, RequestReader().read)

    async def continuation(details: Any) -> Any:
        return handlers.service(details)

    body = deep_update(20_000, size=1)
    for method in service.methods:
        details = Details(f"/{service.full_name}/{method.name}")
        handler = await interceptor.intercept_service(continuation, details)  # type: ignore[arg-type]
        assert isinstance(handler, grpc.RpcMethodHandler)
        kept = handler.request_deserializer(body)
        assert isinstance(kept, Undecoded) and kept.body is body, method.name
