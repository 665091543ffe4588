"""Inspection through the real server and database: ListWorkflows and GetWorkflow's history."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf import timestamp_pb2

from tests.conftest import RunningEngine
from tests.integration.api.test_bad_input import expect_error, snapshot
from tests.integration.api.test_lifecycle import NODE_ORDER_TWO_STEPS
from tests.support.helpers import (
    check,
    new_task_id,
    step,
    task,
    wait_for_status,
    watch_until_end,
)
from workflow_engine.v1 import workflow_engine_pb2 as pb


async def start(
    running: RunningEngine, spec: pb.TaskSpec, user: str = "", project: str = ""
) -> str:
    task_id = new_task_id()
    spec.metadata.CopyFrom(pb.TaskMetadata(user_id=user, project_id=project))
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    return task_id


async def finish(
    running: RunningEngine, spec: pb.TaskSpec, user: str = "", project: str = ""
) -> pb.Workflow:
    return await wait_for_status(running.stub, await start(running, spec, user, project))


async def list_pages(running: RunningEngine, **request: Any) -> list[list[pb.Workflow]]:
    """Every page of a listing, following next_page_token to the end."""
    pages: list[list[pb.Workflow]] = []
    token = ""
    while True:
        answer = await running.stub.ListWorkflows(
            pb.ListWorkflowsRequest(page_token=token, **request)
        )
        pages.append(list(answer.workflows))
        token = answer.next_page_token
        if not token:
            return pages
        assert len(pages) < 100, "pagination does not end"


async def listed(running: RunningEngine, **request: Any) -> list[str]:
    return [wf.task_id for page in await list_pages(running, **request) for wf in page]


def ok_task() -> pb.TaskSpec:
    return task(step("s", "echo", "ok"))


async def test_list_filters_by_status_metadata_and_update_time(running: RunningEngine) -> None:
    # One after another, so their update times are ordered a < b < c < d < e.
    a = await finish(running, ok_task(), user="alice", project="p1")
    b = await finish(running, task(step("s", "false"), max_attempts_per_step=1), "bob", "p1")
    c = await finish(running, ok_task(), user="alice", project="p2")
    d_id = await start(running, task(step("s", "sleep", "5")), user="bob", project="p2")
    d = await running.stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=d_id, reason="stop"))
    e_id = await start(running, task(step("s", "sleep", "30")), user="carol", project="p1")
    try:
        assert [a.status, b.status, c.status, d.status] == [
            pb.SUCCEEDED,
            pb.FAILED,
            pb.SUCCEEDED,
            pb.CANCELLED,
        ]
        ids = [a.task_id, b.task_id, c.task_id, d.task_id, e_id]
        assert await listed(running) == ids[::-1]  # newest update first

        assert await listed(running, statuses=[pb.SUCCEEDED]) == [c.task_id, a.task_id]
        assert await listed(running, statuses=[pb.CANCELLED, pb.FAILED]) == [
            d.task_id,
            b.task_id,
        ]
        assert await listed(running, statuses=[pb.RUNNING]) == [e_id]
        assert await listed(running, statuses=[pb.WAITING_FOR_APPROVAL]) == []
        assert await listed(running, user_id="alice") == [c.task_id, a.task_id]
        assert await listed(running, project_id="p2") == [d.task_id, c.task_id]
        assert await listed(running, user_id="bob", project_id="p1") == [b.task_id]
        assert await listed(running, user_id="bob", statuses=[pb.SUCCEEDED]) == []
        assert await listed(running, user_id="nobody") == []
        # updated_after is inclusive, updated_before exclusive.
        assert await listed(running, updated_after=b.updated_at, updated_before=d.updated_at) == [
            c.task_id,
            b.task_id,
        ]
        assert await listed(running, updated_before=b.updated_at) == [a.task_id]
        assert await listed(
            running, updated_after=c.updated_at, statuses=[pb.SUCCEEDED, pb.CANCELLED]
        ) == [d.task_id, c.task_id]

        # Items are the row without state or history; the lease shows while it is held.
        items = {wf.task_id: wf for wf in (await list_pages(running))[0]}
        for full in (a, b, c, d):
            item = items[full.task_id]
            assert not item.HasField("state") and not item.history
            assert item.status == full.status and item.run_id == full.run_id
            assert item.last_node_id == full.last_node_id
            assert item.updated_at == full.updated_at
            assert (item.summary, item.error) == (full.summary, full.error)
            assert item.lease_holder_id == "" and not item.HasField("lease_expires_at")
        assert items[b.task_id].error and items[d.task_id].error == "stop"
        assert items[e_id].status == pb.RUNNING
        assert items[e_id].lease_holder_id == "test-engine"
        assert items[e_id].HasField("lease_expires_at")
    finally:
        await running.stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=e_id))


async def test_pagination_walks_every_workflow_once_in_order(
    running: RunningEngine, db_url: str
) -> None:
    ids = [await start(running, ok_task()) for _ in range(7)]
    for task_id in ids:
        await wait_for_status(running.stub, task_id)
    # Four share one update time, so pages also have to break ties (by task_id).
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            "UPDATE workflow_checkpoints SET updated_at = '2030-01-01T00:00:00Z'"
            " WHERE task_id = ANY(%s::uuid[])",
            (ids[1:5],),
        )
        cur = await conn.execute(
            "SELECT task_id::text FROM workflow_checkpoints ORDER BY updated_at DESC, task_id"
        )
        expected = [row[0] for row in await cur.fetchall()]

    pages = await list_pages(running, page_size=2)
    assert [len(page) for page in pages] == [2, 2, 2, 1]
    walked = [wf.task_id for page in pages for wf in page]
    assert walked == expected  # no duplicates, no gaps, newest first
    assert sorted(walked) == sorted(ids)
    # Exactly a page's worth: the last page says so with an empty token.
    assert [len(page) for page in await list_pages(running, page_size=7)] == [7]
    assert [len(page) for page in await list_pages(running)] == [7]  # page_size 0 means 50
    # A token goes on with the same filters; here, only the tied workflows.
    tied = {
        "updated_after": timestamp("2030-01-01T00:00:00Z"),
        "updated_before": timestamp("2030-01-01T00:00:01Z"),
    }
    pages = await list_pages(running, page_size=3, **tied)
    assert [len(page) for page in pages] == [3, 1]
    assert [wf.task_id for page in pages for wf in page] == sorted(ids[1:5])


def timestamp(text: str) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromJsonString(text)
    return ts


def retokened(token: str, **changes: Any) -> str:
    """`token` with fields of its JSON replaced (its digest left as it was)."""
    body = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    body.update(changes)
    return base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


# (request given a valid first-page token of an unfiltered page_size=1 listing, field)
BAD_LISTS: list[tuple[str, Callable[[str], pb.ListWorkflowsRequest], str]] = [
    ("page_size", lambda _: pb.ListWorkflowsRequest(page_size=501), "page_size"),
    ("unspecified status", lambda _: pb.ListWorkflowsRequest(statuses=[1, 0]), "statuses[1]"),
    ("unknown status", lambda _: pb.ListWorkflowsRequest(statuses=[3, 1, 99]), "statuses[2]"),
    ("user_id NUL", lambda _: pb.ListWorkflowsRequest(user_id="a\x00b"), "user_id"),
    ("user_id long", lambda _: pb.ListWorkflowsRequest(user_id="u" * 257), "user_id"),
    ("project_id NUL", lambda _: pb.ListWorkflowsRequest(project_id="\x00"), "project_id"),
    ("project_id long", lambda _: pb.ListWorkflowsRequest(project_id="p" * 257), "project_id"),
    (
        "after not before before",
        lambda _: pb.ListWorkflowsRequest(
            updated_after=timestamp("2030-01-01T00:00:00Z"),
            updated_before=timestamp("2030-01-01T00:00:00Z"),
        ),
        "updated_after",
    ),
    (
        "time out of range",
        lambda _: pb.ListWorkflowsRequest(updated_before=timestamp_pb2.Timestamp(seconds=10**12)),
        "updated_before",
    ),
    (
        "bad nanos",
        lambda _: pb.ListWorkflowsRequest(updated_after=timestamp_pb2.Timestamp(nanos=-1)),
        "updated_after",
    ),
    ("token garbage", lambda _: pb.ListWorkflowsRequest(page_token="not a token!"), "page_token"),
    ("token not json", lambda _: pb.ListWorkflowsRequest(page_token="bm9wZQ"), "page_token"),
    ("token too long", lambda _: pb.ListWorkflowsRequest(page_token="A" * 4000), "page_token"),
    ("token truncated", lambda t: pb.ListWorkflowsRequest(page_token=t[:-5]), "page_token"),
    (
        "token task edited",
        lambda t: pb.ListWorkflowsRequest(
            page_token=retokened(t, t="00000000-0000-4000-8000-000000000000")
        ),
        "page_token",
    ),
    (
        "token time edited",
        lambda t: pb.ListWorkflowsRequest(page_token=retokened(t, u="2999-01-01T00:00:00+00:00")),
        "page_token",
    ),
    (
        "token other filters",
        lambda t: pb.ListWorkflowsRequest(page_token=t, user_id="someone"),
        "page_token",
    ),
]


@pytest.mark.parametrize(
    ("make", "field"), [b[1:] for b in BAD_LISTS], ids=[b[0] for b in BAD_LISTS]
)
async def test_bad_list_request_is_invalid_argument_naming_the_field(
    running: RunningEngine,
    db_url: str,
    make: Callable[[str], pb.ListWorkflowsRequest],
    field: str,
) -> None:
    for _ in range(2):
        await finish(running, ok_task())
    first = await running.stub.ListWorkflows(pb.ListWorkflowsRequest(page_size=1))
    assert first.next_page_token
    before = await snapshot(db_url)
    await expect_error(
        running.stub.ListWorkflows(make(first.next_page_token)),
        grpc.StatusCode.INVALID_ARGUMENT,
        field,
    )
    assert await snapshot(db_url) == before


async def test_get_workflow_history_is_every_event_in_graph_order(
    running: RunningEngine,
) -> None:
    wf = await finish(
        running,
        task(
            step("greet", "echo", "hello", expect=[check("stdout_contains", "hello")]),
            step("again", "echo", "again"),
        ),
    )
    assert wf.status == pb.SUCCEEDED
    history = list(wf.history)
    assert [e.sequence for e in history] == list(range(1, len(history) + 1))
    assert [e.node_id for e in history if e.kind == pb.NODE_COMPLETED] == NODE_ORDER_TWO_STEPS
    statuses = [e for e in history if e.kind == pb.STATUS_CHANGED]
    assert [e.status for e in statuses] == [pb.RUNNING, pb.SUCCEEDED]
    assert history[0] == statuses[0] and history[-1] == statuses[-1]
    assert {e.kind for e in history} == {pb.NODE_COMPLETED, pb.STATUS_CHANGED}
    assert all(e.task_id == wf.task_id and e.run_id == wf.run_id for e in history)
    assert all(e.HasField("time") for e in history)
    # The same events a watch from the beginning streams.
    assert await watch_until_end(running.stub, wf.task_id) == history


async def test_history_and_watch_carry_detail_actor_and_every_event_kind(
    running: RunningEngine, db_url: str
) -> None:
    wf = await finish(running, ok_task())
    last = wf.history[-1].sequence
    # What the approval and override writers will store, appended by hand here.
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            """
            INSERT INTO workflow_events (task_id, seq, run_id, kind, node_id, status, detail, actor)
            SELECT %(task)s, %(last)s + n, %(run)s, kind, NULL, 'SUCCEEDED', detail, actor
              FROM unnest(%(kinds)s::text[], %(details)s::text[], %(actors)s::text[])
                   WITH ORDINALITY AS e(kind, detail, actor, n)
            """,
            {
                "task": wf.task_id,
                "last": last,
                "run": wf.run_id,
                "kinds": ["approval_requested", "approval_decided", "overridden", "mystery"],
                "details": ["step s", "APPROVE", "force_branch", ""],
                "actors": ["", "ops@example.com", "oncall", ""],
            },
        )
        await conn.execute(
            "UPDATE workflow_checkpoints SET event_seq = %s WHERE task_id = %s",
            (last + 4, wf.task_id),
        )
    got = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=wf.task_id))
    verify = [e for e in got.history if e.node_id == "verify_step_result"]
    assert [e.detail for e in verify] == ["s: passed"]  # the step's verdict
    added = [(e.kind, e.detail, e.actor) for e in got.history[-4:]]
    expected = [
        (pb.APPROVAL_REQUESTED, "step s", ""),
        (pb.APPROVAL_DECIDED, "APPROVE", "ops@example.com"),
        (pb.OVERRIDDEN, "force_branch", "oncall"),
        (pb.EVENT_KIND_UNSPECIFIED, "", ""),  # an unknown kind (a hand-edited row)
    ]
    assert added == expected
    watched = await watch_until_end(running.stub, wf.task_id, from_sequence=last + 1)
    assert [(e.kind, e.detail, e.actor) for e in watched] == expected
    watched = await watch_until_end(running.stub, wf.task_id)
    assert [e.detail for e in watched if e.node_id == "verify_step_result"] == ["s: passed"]


async def test_history_keeps_the_newest_thousand_events(
    running: RunningEngine, db_url: str
) -> None:
    wf = await finish(running, ok_task())
    last = wf.history[-1].sequence
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            """
            INSERT INTO workflow_events (task_id, seq, run_id, kind, node_id, status)
            SELECT %(task)s, %(last)s + n, %(run)s, 'overridden', NULL, 'SUCCEEDED'
              FROM generate_series(1, 1200) AS n
            """,
            {"task": wf.task_id, "last": last, "run": wf.run_id},
        )
    got = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=wf.task_id))
    assert len(got.history) == 1000
    assert [e.sequence for e in got.history] == list(range(last + 201, last + 1201))


async def test_random_list_requests_get_ok_or_invalid_argument(
    running: RunningEngine, db_url: str
) -> None:
    """A small deterministic fuzz: no request makes ListWorkflows fail any other way."""
    for _ in range(3):
        await finish(running, ok_task(), user="u")
    first = await running.stub.ListWorkflows(pb.ListWorkflowsRequest(page_size=1))
    token = first.next_page_token
    before = await snapshot(db_url)
    rng = random.Random(5)
    texts = ["", "u", "\x01", "é", "\x00", "x" * 300, token, token[:-1] + "A", "=" * 8]
    raw = running.channel.unary_unary(
        "/workflow_engine.v1.WorkflowEngine/ListWorkflows",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    codes: set[grpc.StatusCode] = set()
    for i in range(200):
        request = pb.ListWorkflowsRequest(
            statuses=rng.sample(range(-1, 9), rng.randint(0, 3)),
            user_id=rng.choice(texts),
            project_id=rng.choice(texts),
            page_size=rng.choice([0, 1, 2, 500, 501, 2**32 - 1]),
            page_token=rng.choice(texts),
        )
        for name in ("updated_after", "updated_before"):
            if rng.random() < 0.5:
                getattr(request, name).CopyFrom(
                    timestamp_pb2.Timestamp(
                        seconds=rng.choice([-(2**62), -62_135_596_801, 0, 1_900_000_000, 2**40]),
                        nanos=rng.choice([-1, 0, 999_999_999, 10**9]),
                    )
                )
        body = request.SerializeToString()
        if i % 4 == 0:  # and some bytes that are not a request at all
            body = bytes(rng.randrange(256) for _ in range(rng.randint(1, 60)))
        try:
            await raw(body)
            codes.add(grpc.StatusCode.OK)
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (request, err.details())
            codes.add(err.code())
    assert codes == {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}
    assert await snapshot(db_url) == before
