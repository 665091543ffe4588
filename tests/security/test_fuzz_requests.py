"""Bytes from anyone, to every RPC: the answer is always a status that says something, and the
server keeps answering health checks within a second (issue 48's bounded fuzz).

For every method of `workflow_engine.v1.WorkflowEngine`, with the orchestrator's token and with
none: random bytes, valid requests truncated or with bytes flipped, Structs (or unknown groups)
nested deeper than protobuf goes, requests one byte to a thousand past the server's message
limit, and repeated fields or a Struct's keys filling that limit. A fixed seed makes every run
send the same bytes in the same order; a time limit keeps it inside `make test`: it stops where
it has got to, every kind of body having been sent to every method in the first round.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from tests.conftest import RunningEngine
from tests.security.conftest import as_caller
from tests.security.stalls import HealthWatch
from tests.support.helpers import step, struct, task
from tests.support.wire import field as wire_field
from tests.support.wire import head, nested_struct, varint
from workflow_engine.v1 import workflow_engine_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["WorkflowEngine"]
SEED = 48
FUZZ_SECONDS = 20.0
IN_FLIGHT = 4
HEALTH_LIMIT_SECONDS = 1.0
#: Answers that say nothing: a bug let an exception out, or the server gave up on the call.
SAYS_NOTHING = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
#: A live WatchWorkflow stream is hung up on after this long (its deadline).
WATCH_SECONDS = 0.5


def valid_requests(rng: random.Random, seeded: str) -> dict[str, bytes]:
    """A well-formed request for each method, most aimed at the seeded workflow."""
    new_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    start = pb.StartWorkflowRequest(
        task_id=new_id,
        holder_id="fuzz",
        task=task(step("s", "true"), preferences=[struct({"a": [1, "b", {"c": None}]})]),
        lease_ttl_seconds=30,
    )
    decision = pb.ApprovalDecision(step_id="gate", verdict=pb.APPROVE, reason="fine")
    requests = {
        "StartWorkflow": start,
        "ResumeWorkflow": pb.ResumeWorkflowRequest(task_id=seeded, decision=decision),
        "GetWorkflow": pb.GetWorkflowRequest(task_id=seeded),
        "CancelWorkflow": pb.CancelWorkflowRequest(task_id=new_id, reason="fuzz"),
        "WatchWorkflow": pb.WatchWorkflowRequest(task_id=seeded, kinds=[1, 2]),
        "ListWorkflows": pb.ListWorkflowsRequest(statuses=[1], page_size=10, project_id="p"),
        "UpdateWorkflow": pb.UpdateWorkflowRequest(
            task_id=seeded, operator="op", set_state=struct({"summary": "s"})
        ),
        "CreateSchedule": pb.CreateScheduleRequest(
            schedule=pb.Schedule(cron="@every 1h", time_zone="Europe/Berlin", task=start.task)
        ),
        "GetSchedule": pb.GetScheduleRequest(schedule_id=new_id),
        "ListSchedules": pb.ListSchedulesRequest(page_size=10),
        "UpdateSchedule": pb.UpdateScheduleRequest(
            schedule=pb.Schedule(schedule_id=new_id, cron="0 2 * * *", paused=True),
            update_mask=["paused", "cron"],
        ),
        "DeleteSchedule": pb.DeleteScheduleRequest(schedule_id=new_id),
    }
    return {name: message.SerializeToString() for name, message in requests.items()}


def random_bytes(rng: random.Random, base: bytes, limit: int, descriptor: Descriptor) -> bytes:
    return rng.randbytes(rng.choice([0, 1, 2, 5, 17, 300, 4096]))


def truncated(rng: random.Random, base: bytes, limit: int, descriptor: Descriptor) -> bytes:
    return base[: rng.randrange(len(base))]


def flipped(rng: random.Random, base: bytes, limit: int, descriptor: Descriptor) -> bytes:
    body = bytearray(base)
    for _ in range(rng.randint(1, 4)):
        body[rng.randrange(len(body))] = rng.randrange(256)
    return bytes(body)


#: Structs nested 40 to 50,000 deep (levels, bytes at the bottom), built before the clock
#: starts: building 50,000 levels takes the test's own event loop most of a second.
NESTED_SHAPES = [(40, 0), (120, 1000), (400, 100_000), (5000, 0), (50_000, 1000)]


@functools.cache
def nested_shape(levels: int, size: int) -> bytes:
    return nested_struct(levels, b"A" * size)


def nested(rng: random.Random, base: bytes, limit: int, descriptor: Descriptor) -> bytes:
    """The request with a Struct nested 40 to 50,000 deep where it has one (past protobuf's
    limit of 100 messages, but for 40 unknown groups), else unknown groups nested as deep."""
    levels, size = rng.choice(NESTED_SHAPES)
    path = struct_path(descriptor)
    if path is None:
        return base + varint(99 << 3 | 3) * levels + varint(99 << 3 | 4) * levels
    inner = nested_shape(levels, size)
    for number in reversed(path):
        inner = wire_field(number, inner)
    return base + inner


def huge(rng: random.Random, base: bytes, limit: int, descriptor: Descriptor) -> bytes:
    """The request with one repeated field (a field repeated, if it has none) filling the
    message limit all but a little."""
    path, element = repeated_element(rng, descriptor)
    size = rng.randint(limit - 64 * 1024, limit - 1024) - len(base)
    inner = element * (size // len(element))
    for number in reversed(path):
        inner = head(number, len(inner)) + inner
    return base + inner


@functools.cache
def wide_struct(size: int) -> bytes:
    """A `google.protobuf.Struct` of some `size` bytes: {"0": null, "1": null, ...}, the shape
    that costs protobuf the most to decode (4 MiB of it: 0.4 s, holding the interpreter)."""
    entries = []
    for i in itertools.count():
        if size < 16:
            return b"".join(entries)
        entries.append(wire_field(1, wire_field(1, str(i).encode()) + wire_field(2, b"\x08\x00")))
        size -= len(entries[-1])
    raise AssertionError("unreachable")


def wide(rng: random.Random, base: bytes, limit: int, descriptor: Descriptor) -> bytes:
    """The request with a Struct (where it has one) of distinct keys filling the message limit
    all but 64 KiB; else one repeated field filling it (`huge`)."""
    path = struct_path(descriptor)
    if path is None:
        return huge(rng, base, limit, descriptor)
    inner = wide_struct(limit - 64 * 1024 - len(base))
    for number in reversed(path):
        inner = wire_field(number, inner)
    return base + inner


def oversized(rng: random.Random, base: bytes, limit: int, descriptor: Descriptor) -> bytes:
    return base + wire_field(15, b"x" * (limit + rng.randint(1, 1000)))


def struct_path(descriptor: Descriptor, depth: int = 3) -> tuple[int, ...] | None:
    """Field numbers leading to a `google.protobuf.Struct` within `depth` messages, if any."""
    for fd in descriptor.fields:
        kind = fd.message_type
        if kind is None:
            continue
        if kind.full_name == "google.protobuf.Struct":
            return (fd.number,)
        if depth > 1 and not kind.full_name.startswith("google."):
            below = struct_path(kind, depth - 1)
            if below is not None:
                return (fd.number, *below)
    return None


def repeated_element(rng: random.Random, descriptor: Descriptor) -> tuple[tuple[int, ...], bytes]:
    """A path to a repeated field (within two messages) and one small element of it on the
    wire; the first field, repeated, for a message with none."""
    found = [((), fd) for fd in descriptor.fields if fd.is_repeated]
    for fd in descriptor.fields:
        kind = fd.message_type
        if kind is not None and not fd.is_repeated and not kind.full_name.startswith("google."):
            found.extend(((fd.number,), inner) for inner in kind.fields if inner.is_repeated)
    if not found:
        return (), wire_field(descriptor.fields[0].number, b"x")
    path, fd = rng.choice(found)
    if fd.message_type is not None:
        return path, wire_field(fd.number, b"")  # an empty message
    if fd.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        return path, wire_field(fd.number, b"x")
    return path, varint(fd.number << 3) + b"\x01"  # a number, unpacked


#: Each kind of body: (random, a valid request, the message limit, its descriptor) -> bytes.
KINDS: dict[str, Callable[[random.Random, bytes, int, Descriptor], bytes]] = {
    "random": random_bytes,
    "truncated": truncated,
    "flipped": flipped,
    "nested": nested,
    "huge": huge,
    "wide": wide,
    "oversized": oversized,
}
#: Kinds of 4 MiB a body, and the rounds that send them (the others go in every round).
COSTLY_ROUNDS = {"huge": 2, "wide": 1, "oversized": 1}


@dataclass
class Tally:
    codes: Counter[str] = field(default_factory=Counter)
    wrong: list[str] = field(default_factory=list)
    calls: int = 0


async def send(
    served: RunningEngine,
    method: str,
    body: bytes,
    metadata: list[tuple[str, str]] | None,
    watch_seconds: float = WATCH_SECONDS,
) -> tuple[grpc.StatusCode, str]:
    """Call `method` with `body` as its bytes: the status code and its details."""
    path = f"/{SERVICE.full_name}/{method}"
    try:
        if method == "WatchWorkflow":
            stream = served.channel.unary_stream(path)(
                body, metadata=metadata, timeout=watch_seconds
            )
            async for _ in stream:
                pass
        else:
            await served.channel.unary_unary(path)(body, metadata=metadata, timeout=30)
    except grpc.aio.AioRpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


def judge(method: str, kind: str, caller: str | None, code: grpc.StatusCode) -> bool:
    """Whether `code` is a right answer to this call."""
    if code in SAYS_NOTHING:
        return False
    if kind == "oversized":
        return code == grpc.StatusCode.RESOURCE_EXHAUSTED
    if caller is None:
        return code == grpc.StatusCode.UNAUTHENTICATED
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return method == "WatchWorkflow"  # a live stream, hung up on
    return code not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


def cases(seeded: str, limit: int) -> Iterator[tuple[str, str, str | None, bytes]]:
    """(method, kind, caller, body), round by round: each round every method, kind and caller."""
    rng = random.Random(SEED)
    for round_ in itertools.count():
        valid = valid_requests(rng, seeded)
        for method in SERVICE.methods:
            for kind, make in KINDS.items():
                if round_ >= COSTLY_ROUNDS.get(kind, round_ + 1):
                    continue
                body = make(rng, valid[method.name], limit, method.input_type)
                for caller in ("orchestrator", None):
                    yield method.name, kind, caller, body


@pytest.mark.timing
async def test_no_request_bytes_get_a_silent_answer_or_stall_the_server(
    served: RunningEngine,
) -> None:
    """No call answers UNKNOWN or INTERNAL (or, without a token, anything but UNAUTHENTICATED),
    and no health check waits a second, while `IN_FLIGHT` calls at a time go in."""
    seeded = str(uuid.UUID(int=random.Random(SEED).getrandbits(128), version=4))
    gate = task(step("gate", "true", requires_approval=True))
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=seeded, task=gate), metadata=as_caller("orchestrator")
    )
    limit = served.engine.settings.max_message_bytes
    for shape in NESTED_SHAPES:
        nested_shape(*shape)
    for method in SERVICE.methods:  # the Structs of `wide`, built before the clock starts
        wide(
            random.Random(),
            valid_requests(random.Random(SEED), seeded)[method.name],
            limit,
            method.input_type,
        )
    tally = Tally()
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def one(method: str, kind: str, caller: str | None, body: bytes) -> None:
        # A body past the limit opens no stream: it is refused once it has arrived, which for
        # 4 MiB sent within this process took up to a second (so its call gets that long).
        watch = 30 if kind == "oversized" else WATCH_SECONDS
        try:
            metadata = as_caller(caller) if caller else None
            code, details = await send(served, method, body, metadata, watch)
            tally.calls += 1
            tally.codes[code.name] += 1
            if not judge(method, kind, caller, code):
                tally.wrong.append(f"{method} {kind} {caller}: {code.name} {details[:120]}")
        finally:
            slots.release()

    started = time.perf_counter()
    async with HealthWatch(served.channel) as health, asyncio.TaskGroup() as calls:
        for method, kind, caller, body in cases(seeded, limit):
            if time.perf_counter() - started > FUZZ_SECONDS:
                break
            await slots.acquire()
            calls.create_task(one(method, kind, caller, body))
    print(
        f"{tally.calls} calls in {time.perf_counter() - started:.1f}s, codes {dict(tally.codes)},"
        f" worst health wait {health.worst:.3f}s"
    )
    assert not tally.wrong, "\n".join(tally.wrong[:20])
    assert health.worst < HEALTH_LIMIT_SECONDS


@pytest.mark.timing
async def test_a_callers_huge_request_does_not_stall_the_server(served: RunningEngine) -> None:
    """The orchestrator's StartWorkflow with 60,000 empty steps (120 KB of the 4 MiB it may
    send) held the event loop for 3.8 s before it was refused: every step was converted and
    validated, then `MAX_STEPS` (500) refused them. The steps are counted first now."""
    inner = wire_field(3, b"") * 60_000  # TaskSpec.steps, each empty
    body = wire_field(1, str(uuid.uuid4()).encode()) + head(4, len(inner)) + inner
    async with HealthWatch(served.channel) as health:
        code, _ = await send(served, "StartWorkflow", body, as_caller("orchestrator"))
    print(f"{code.name}, worst health wait {health.worst:.3f}s")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert health.worst < HEALTH_LIMIT_SECONDS
