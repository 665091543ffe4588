"""A task driven end to end through the real gRPC server and a real PostgreSQL."""

from __future__ import annotations

import psycopg
from google.protobuf import struct_pb2

from tests.conftest import RunningEngine
from tests.support.helpers import (
    check,
    new_task_id,
    shell_step,
    step,
    task,
    wait_for_status,
    wait_until_released,
    watch_until_end,
)
from workflow_engine.v1 import workflow_engine_pb2 as pb

NODE_ORDER_TWO_STEPS = [
    "load_task_context",
    "plan_steps",
    "dispatch_step",
    "collect_result",
    "verify_step_result",
    "dispatch_step",
    "collect_result",
    "verify_step_result",
    "finalize_summary",
]

# Records every insert and update of a checkpoint row, so the test sees the writes themselves,
# not the engine's account of them.
HISTORY_TRIGGER = """
CREATE TABLE checkpoint_history (
    id bigserial PRIMARY KEY, op text, last_node_id text, status text, state jsonb
);
CREATE FUNCTION record_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO checkpoint_history (op, last_node_id, status, state)
    VALUES (TG_OP, NEW.last_node_id, NEW.status, NEW.state);
    RETURN NULL;
END $$;
CREATE TRIGGER record_checkpoint AFTER INSERT OR UPDATE ON workflow_checkpoints
    FOR EACH ROW EXECUTE FUNCTION record_checkpoint();
"""


async def test_two_step_task_succeeds_with_one_upsert_per_node_in_order(
    running: RunningEngine, db_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(HISTORY_TRIGGER)
    task_id = new_task_id()
    spec = task(
        step("greet", "echo", "hello", expect=[check("stdout_contains", "hello")]),
        shell_step(
            "json",
            'echo \'{"result": {"ok": true, "n": 2}}\'',
            expect=[check("json_field_equals", field="result.n", equals=2)],
        ),
        acceptance_criteria=[
            pb.AcceptanceCriterion(description="reports ok", check=check("stdout_contains", "ok"))
        ],
        preferences=[],
    )

    started = await running.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=spec, holder_id="orchestrator-1")
    )
    assert started.status == pb.STARTED
    assert started.run_id and started.lease_id

    events = await watch_until_end(running.stub, task_id)
    nodes = [e.node_id for e in events if e.kind == pb.NODE_COMPLETED]
    assert nodes == NODE_ORDER_TWO_STEPS
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    statuses = [e.status for e in events if e.kind == pb.STATUS_CHANGED]
    assert statuses == [pb.RUNNING, pb.SUCCEEDED]

    wf = await wait_for_status(running.stub, task_id)
    assert wf.status == pb.SUCCEEDED
    assert wf.last_node_id == "finalize_summary"
    # Released, just after the final checkpoint (so possibly after the status was read).
    assert (await wait_until_released(running.stub, task_id, timeout=5)).lease_holder_id == ""
    state = dict(wf.state)
    assert state["current_step_index"] == 2
    assert dict(state["attempts_by_step"]) == {"greet": 1, "json": 1}
    assert state["verification"]["status"] == "pass"
    assert "All 2 step(s) passed" in wf.summary

    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        cur = await conn.execute("SELECT op, last_node_id FROM checkpoint_history ORDER BY id")
        history = await cur.fetchall()
    assert history[0] == ("INSERT", None)  # StartWorkflow creates the row
    assert [node for _, node in history[1:]] == NODE_ORDER_TWO_STEPS


async def test_failing_check_is_retried_up_to_the_limit_then_failed(
    running: RunningEngine, tmp_path
) -> None:
    attempts_file = tmp_path / "attempts.txt"
    task_id = new_task_id()
    spec = task(
        shell_step(
            "flaky",
            f'echo "$WORKFLOW_ENGINE_ATTEMPT" >> {attempts_file}; echo nope; exit 3',
            expect=[check("stdout_contains", "done")],
        ),
        max_attempts_per_step=3,
    )
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    wf = await wait_for_status(running.stub, task_id)

    assert wf.status == pb.FAILED
    assert wf.last_node_id == "mark_failed"
    assert attempts_file.read_text().split() == ["1", "2", "3"]  # three jobs, each ran once
    state = dict(wf.state)
    assert dict(state["attempts_by_step"]) == {"flaky": 3}
    verification = state["verification"]
    assert verification["status"] == "fail"
    failed = [f for f in verification["findings"] if not f["passed"]]
    assert {f["check"] for f in failed} >= {"stdout_contains", "exit_code"}
    assert "flaky failed after 3 attempt(s)" in wf.error


async def test_retry_carries_the_findings_as_remediation(running: RunningEngine, tmp_path) -> None:
    seen = tmp_path / "remediation.json"
    task_id = new_task_id()
    spec = task(
        shell_step(
            "second-time-lucky",
            f'echo "$WORKFLOW_ENGINE_REMEDIATION" > {seen}; test "$WORKFLOW_ENGINE_ATTEMPT" -ge 2',
        )
    )
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    wf = await wait_for_status(running.stub, task_id)
    assert wf.status == pb.SUCCEEDED
    assert dict(dict(wf.state)["attempts_by_step"]) == {"second-time-lucky": 2}
    assert "exit" in seen.read_text().lower()  # attempt 2 was told why attempt 1 failed


async def test_prompt_without_steps_is_planned_from_its_command_lines(
    running: RunningEngine,
) -> None:
    task_id = new_task_id()
    spec = pb.TaskSpec(prompt="Say hi twice.\n$ echo hi\n$ echo 'hi again'")
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    wf = await wait_for_status(running.stub, task_id)
    assert wf.status == pb.SUCCEEDED
    steps = dict(wf.state)["plan"]["steps"]
    assert [list(s["command"]) for s in steps] == [["echo", "hi"], ["echo", "hi again"]]


async def test_json_field_equals_an_explicit_null_is_a_check_for_null(
    running: RunningEngine,
) -> None:
    null = struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)
    spec = task(
        shell_step(
            "nothing",
            'echo \'{"x": null, "y": 1}\'',
            expect=[pb.Check(kind="json_field_equals", field="x", equals=null)],
        ),
        acceptance_criteria=[
            pb.AcceptanceCriterion(
                description="y is null",
                check=pb.Check(kind="json_field_equals", field="y", equals=null),
            )
        ],
        max_attempts_per_step=1,
    )
    task_id = new_task_id()
    started = await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    assert started.status == pb.STARTED
    wf = await wait_for_status(running.stub, task_id)
    # The step's check passes; the criterion's does not (y is 1), so null was compared, not
    # skipped.
    assert wf.status == pb.FAILED
    findings = dict(wf.state)["verification"]["findings"]
    passed = {f["check"]: f["passed"] for f in findings}
    assert passed["json_field_equals"] is True
    assert passed["criterion[0]:json_field_equals"] is False


async def test_cancel_stops_a_running_workflow_and_releases_the_lease(
    running: RunningEngine,
) -> None:
    task_id = new_task_id()
    spec = task(step("slow", "sleep", "2"), step("never", "echo", "unreachable"))
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    wf = await running.stub.CancelWorkflow(
        pb.CancelWorkflowRequest(task_id=task_id, reason="operator said so")
    )
    assert wf.status == pb.CANCELLED
    assert wf.error == "operator said so"
    assert wf.lease_holder_id == ""
    assert not running.engine.runs.is_live(task_id)
    final = await running.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id))
    assert final.status == pb.CANCELLED
    assert "never" not in dict(final.state["attempts_by_step"])
    # Cancel again is idempotent, and resuming a cancelled workflow runs nothing.
    again = await running.stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=task_id))
    assert again.status == pb.CANCELLED
    resumed = await running.stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=task_id))
    assert resumed.status == pb.CANCELLED and not resumed.resumed
