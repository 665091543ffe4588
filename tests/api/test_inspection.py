"""Inspection through the real server and database: GetWorkflow's history."""

from __future__ import annotations

import psycopg

from tests.api.test_lifecycle import NODE_ORDER_TWO_STEPS
from tests.conftest import RunningEngine
from tests.helpers import (
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


def ok_task() -> pb.TaskSpec:
    return task(step("s", "echo", "ok"))


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
            "UPDATE workflow_events SET detail = 'pass' WHERE task_id = %s AND node_id = %s",
            (wf.task_id, "verify_step_result"),
        )
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
    assert [e.detail for e in verify] == ["pass"]
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
    assert [e.detail for e in watched if e.node_id == "verify_step_result"] == ["pass"]


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
