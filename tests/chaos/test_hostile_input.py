"""Case 8: fuzz every RPC; every answer has a correct code, none UNKNOWN/INTERNAL, no row moves.

The engine runs as its own process (the installed command), and hypothesis drives it with a
plain synchronous client: generated requests, raw random bytes, and hand-made monsters
(oversized messages, 10,000 steps, deep preferences, huge env maps, invalid UTF-8).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.chaos.conftest import FULL, record, scale
from tests.support.engine_process import EngineProcess
from tests.support.helpers import write_secret
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # larger than the server's message limit
}
SAFE_PROGRAMS = ["echo", "true", "false", "no-such-program-x"]
METHODS = ["StartWorkflow", "ResumeWorkflow", "GetWorkflow", "CancelWorkflow", "WatchWorkflow"]

codes: Counter[str] = Counter()
refused_task_ids: set[str] = set()
accepted_task_ids: set[str] = set()


@pytest.fixture
def stub(db_url: str, tmp_path: Path) -> Iterator[Any]:
    proc = EngineProcess(db_url=db_url, data_dir=tmp_path / "data", holder_id="fuzz")
    channel = grpc.insecure_channel(
        proc.address, options=[("grpc.max_send_message_length", 64 * 1024 * 1024)]
    )
    try:
        yield pb_grpc.WorkflowEngineStub(channel), channel, db_url
    finally:
        channel.close()
        proc.kill()


def call(stub: Any, method: str, request: Any) -> grpc.StatusCode:
    return _answer(lambda: getattr(stub, method)(request, timeout=30), method)


def raw_call(channel: grpc.Channel, method: str, body: bytes) -> grpc.StatusCode:
    path = f"/workflow_engine.v1.WorkflowEngine/{method}"
    kind = channel.unary_stream if method == "WatchWorkflow" else channel.unary_unary
    rpc: Callable[..., Any] = kind(
        path, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )
    return _answer(lambda: rpc(body, timeout=30), method)


def _answer(invoke: Callable[[], Any], method: str) -> grpc.StatusCode:
    """The status code of one call; a live watch stream is read a little, then hung up on."""
    try:
        answer = invoke()
        if method == "WatchWorkflow":
            for _ in zip(range(3), answer, strict=False):
                pass
            answer.cancel()
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.CANCELLED and method == "WatchWorkflow":
            return grpc.StatusCode.OK  # we hung up on a live stream
        return err.code()


def tally(code: grpc.StatusCode) -> None:
    codes[code.name] += 1
    assert code in ALLOWED, code


json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=False, width=32) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ids = st.one_of(st.uuids().map(str), st.text(max_size=40), st.just(""))
checks = st.builds(
    dict,
    kind=st.sampled_from(
        [
            "exit_code",
            "stdout_contains",
            "stdout_matches",
            "file_exists",
            "json_field_equals",
            "stderr_contains",
            "telepathy",
            "",
        ]
    ),
    value=st.text(max_size=30),
    field=st.text(max_size=10),
    equals=json_values,
)
steps = st.builds(
    dict,
    id=st.text(max_size=12),
    command=st.lists(st.text(max_size=15), max_size=4).map(
        lambda argv: [SAFE_PROGRAMS[len(argv[0]) % 4], *argv[1:]] if argv else []
    ),
    env=st.dictionaries(st.text(max_size=10), st.text(max_size=20), max_size=4),
    timeout_seconds=st.integers(0, 2**32 - 1),
    depends_on=st.lists(st.text(max_size=8), max_size=2),
    expect=st.lists(checks, max_size=3),
)
tasks = st.builds(
    dict,
    prompt=st.text(max_size=200),
    steps=st.lists(steps, max_size=4),
    acceptance_criteria=st.lists(
        st.builds(dict, description=st.text(max_size=20), check=checks), max_size=2
    ),
    preferences=st.lists(st.dictionaries(st.text(max_size=8), json_values, max_size=3), max_size=2),
    metadata=st.builds(
        dict,
        user_id=st.text(max_size=10),
        labels=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
    ),
    max_attempts_per_step=st.integers(0, 2**32 - 1),
)
starts = st.builds(
    dict,
    task_id=ids,
    holder_id=st.text(max_size=30),
    idempotency_key=ids,
    task=tasks,
    lease_ttl_seconds=st.integers(0, 2**32 - 1),
)


def to_message(data: dict[str, Any]) -> pb.StartWorkflowRequest | None:
    try:
        return json_format.ParseDict(data, pb.StartWorkflowRequest())
    except (json_format.ParseError, ValueError):
        return None  # not expressible as the message (e.g. a float where a string goes)


def snapshot(db_url: str, task_id: str) -> list[Any]:
    with psycopg.connect(db_url) as conn:
        return [
            conn.execute(f"SELECT t::text FROM {table} t WHERE task_id = %s", (task_id,)).fetchall()
            for table in (
                "workflow_checkpoints",
                "task_workflow_leases",
                "workflow_tasks",
                "workflow_events",
            )
        ]


FUZZ = settings(
    max_examples=scale(60, 1500),
    # `make test` replays the same examples every run; `make chaos` explores new ones.
    derandomize=not FULL,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def test_hostile_input(stub: Any) -> None:
    client, channel, db_url = stub
    seeded = str(uuid.uuid4())
    spec = pb.TaskSpec(steps=[pb.Step(id="s", command=["true"])])
    client.StartWorkflow(pb.StartWorkflowRequest(task_id=seeded, task=spec))
    for _ in range(200):
        if client.GetWorkflow(pb.GetWorkflowRequest(task_id=seeded)).status == pb.SUCCEEDED:
            break
        __import__("time").sleep(0.05)
    before = snapshot(db_url, seeded)

    @FUZZ
    @given(start=starts, aim_at_seeded=st.booleans())
    def fuzz_start(start: dict[str, Any], aim_at_seeded: bool) -> None:
        if aim_at_seeded:
            start["task_id"] = seeded
        request = to_message(start)
        if request is None:
            return
        code = call(client, "StartWorkflow", request)
        tally(code)
        if request.task_id == seeded or not _is_uuid(request.task_id):
            return
        canonical = str(uuid.UUID(request.task_id))
        if code == grpc.StatusCode.OK:
            accepted_task_ids.add(canonical)
        else:
            refused_task_ids.add(canonical)

    @FUZZ
    @given(method=st.sampled_from(METHODS[1:]), task_id=ids | st.just(seeded))
    def fuzz_others(method: str, task_id: str) -> None:
        request = {
            "ResumeWorkflow": pb.ResumeWorkflowRequest,
            "GetWorkflow": pb.GetWorkflowRequest,
            "CancelWorkflow": pb.CancelWorkflowRequest,
            "WatchWorkflow": pb.WatchWorkflowRequest,
        }[method](task_id=task_id)
        tally(call(client, method, request))

    @FUZZ
    @given(method=st.sampled_from(METHODS), body=st.binary(max_size=300))
    def fuzz_bytes(method: str, body: bytes) -> None:
        tally(raw_call(channel, method, body))

    fuzz_start()
    fuzz_others()
    fuzz_bytes()

    monsters = monster_requests(seeded)
    for method, body in monsters:
        code = raw_call(channel, method, body)
        tally(code)
        assert code != grpc.StatusCode.OK, method

    assert snapshot(db_url, seeded) == before  # the finished workflow nothing may change
    with psycopg.connect(db_url) as conn:
        stored = {
            row[0]
            for row in conn.execute("SELECT task_id::text FROM workflow_checkpoints").fetchall()
        }
    # A task id may be accepted once and refused later (ALREADY_EXISTS): only ids never
    # accepted must have no row.
    leaked = (refused_task_ids - accepted_task_ids) & stored
    total = sum(codes.values())
    bad = codes["UNKNOWN"] + codes["INTERNAL"]
    record(
        "8 hostile input",
        requests=total,
        correct_code_share=round((total - bad) / total, 4),
        unknown_or_internal=bad,
        refused_starts_that_left_rows=len(leaked),
        codes=json.dumps(dict(codes)),
    )
    assert bad == 0
    assert not leaked


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
        return True
    except ValueError:
        return False


def monster_requests(seeded: str) -> list[tuple[str, bytes]]:
    def start(**task: Any) -> bytes:
        return pb.StartWorkflowRequest(
            task_id=str(uuid.uuid4()), task=pb.TaskSpec(**task)
        ).SerializeToString()

    many_steps = [pb.Step(id=f"s{i}", command=["true"]) for i in range(10_000)]
    huge_env = {f"K{i}": "v" for i in range(20_000)}
    bad_utf8 = start(prompt="MARKMARK").replace(b"MARKMARK", b"\xff\xfe\xfd\xfc\xff\xfe\xfd\xfc")
    return [
        ("StartWorkflow", start(prompt="x" * (5 * 1024 * 1024))),  # over the 4 MiB limit
        ("StartWorkflow", start(steps=many_steps)),
        ("StartWorkflow", start(steps=[pb.Step(id="s", command=["true"], env=huge_env)])),
        ("StartWorkflow", deep_preferences(45)),  # past our limit of 32 levels
        ("StartWorkflow", deep_preferences(80)),  # past protobuf's own decoding limit
        ("StartWorkflow", bad_utf8),
        ("GetWorkflow", b"\x0a\x04\xff\xff\xff\xff"),
        (
            "CancelWorkflow",
            pb.CancelWorkflowRequest(task_id=seeded, reason="r" * 10_000).SerializeToString(),
        ),
    ]


def deep_preferences(levels: int) -> bytes:
    """A StartWorkflowRequest whose preference Struct nests `levels` deep, as wire bytes."""

    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2]) + _varint(len(payload)) + payload

    struct = b""
    for _ in range(levels):
        value = field(5, struct)  # Value.struct_value
        struct = field(1, field(1, b"x") + field(2, value))  # Struct.fields entry {x: value}
    task = field(4, struct)  # TaskSpec.preferences
    return field(1, str(uuid.uuid4()).encode()) + field(4, task)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


CREDENTIALS = "orchestrator-token-for-the-fuzz-0123456789"


@pytest.fixture
def guarded_stub(db_url: str, tmp_path: Path) -> Iterator[Any]:
    """An engine that knows one caller; the fuzz never has its token."""
    tokens = tmp_path / "tokens.json"
    caller = {"identity": "ci", "role": "orchestrator", "token": CREDENTIALS}
    write_secret(tokens, json.dumps({"callers": [caller]}))
    proc = EngineProcess(
        db_url=db_url,
        data_dir=tmp_path / "data",
        holder_id="fuzz-auth",
        extra_env={"WORKFLOW_ENGINE_TOKENS_FILE": str(tokens)},
    )
    channel = grpc.insecure_channel(proc.address)
    try:
        yield pb_grpc.WorkflowEngineStub(channel), db_url
    finally:
        channel.close()
        proc.kill()


header_values = st.one_of(
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=200),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(
        lambda t: "Bearer " + t
    ),
    st.sampled_from(["Bearer", "Bearer ", "bearer  x", "Basic " + CREDENTIALS, CREDENTIALS]),
)


def test_hostile_credentials(guarded_stub: Any) -> None:
    """Every method, with missing, malformed, repeated and huge `authorization` metadata:
    always UNAUTHENTICATED, never anything stored."""
    client, db_url = guarded_stub
    seeded = str(uuid.uuid4())
    spec = pb.TaskSpec(steps=[pb.Step(id="s", command=["true"])])
    requests = {
        "StartWorkflow": pb.StartWorkflowRequest(task_id=seeded, task=spec),
        "ResumeWorkflow": pb.ResumeWorkflowRequest(task_id=seeded),
        "GetWorkflow": pb.GetWorkflowRequest(task_id=seeded),
        "CancelWorkflow": pb.CancelWorkflowRequest(task_id=seeded),
        "WatchWorkflow": pb.WatchWorkflowRequest(task_id=seeded),
        "ListWorkflows": pb.ListWorkflowsRequest(),
    }
    seen: Counter[str] = Counter()

    def answer(method: str, metadata: list[tuple[str, str]]) -> grpc.StatusCode:
        rpc = getattr(client, method)
        return _answer(lambda: rpc(requests[method], metadata=metadata, timeout=30), method)

    @FUZZ
    @given(
        method=st.sampled_from(sorted(requests)),
        values=st.lists(header_values, max_size=4),
    )
    def fuzz_headers(method: str, values: list[str]) -> None:
        code = answer(method, [("authorization", v) for v in values])
        seen[code.name] += 1
        assert code == grpc.StatusCode.UNAUTHENTICATED, (method, values, code)

    fuzz_headers()
    monsters = [
        [("authorization", "Bearer " + "x" * 7000)],  # near gRPC's 8 KiB metadata limit
        [("authorization", "Bearer " + CREDENTIALS[:-1])],  # one character short
        [("authorization", f"Bearer {CREDENTIALS}x")],
        [("authorization", "Bearer junk")] * 50,
        [("authorization", f"Bearer {CREDENTIALS}"), ("authorization", "Bearer junk")],
    ]
    for metadata in monsters:
        for method in requests:
            code = answer(method, metadata)
            seen[code.name] += 1
            assert code == grpc.StatusCode.UNAUTHENTICATED, (method, metadata[0][1][:40], code)
    with psycopg.connect(db_url) as conn:
        rows = conn.execute("SELECT count(*) FROM workflow_checkpoints").fetchone()
    assert rows is not None and rows[0] == 0  # no call got through
    record("8b hostile credentials", requests=sum(seen.values()), codes=json.dumps(dict(seen)))
