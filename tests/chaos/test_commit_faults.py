"""Case 6: errors at the checkpoint commit and at lease renewal change nothing in the outcome.

The same workflow runs once without faults and once with a database error injected before a
checkpoint write, after one (the commit landed but its answer was lost), and at a renewal.
The retried writes must leave the same state, and the same node events, as the clean run.
"""

from __future__ import annotations

from typing import Any

from tests.chaos.conftest import record
from tests.conftest import start_engine, stop_engine
from tests.support.helpers import new_task_id, shell_step, task, wait_for_status, watch_until_end
from workflow_engine.config import Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb

FAULTS = [
    "dberror:before:load_task_context",
    "dberror:after:plan_steps",
    "dberror:before:collect_result#2",
    "dberror:after:verify_step_result#2",
    "dberror:after:finalize_summary",
    "dberror:renew:*",
]


def outcome(wf: pb.Workflow, events: list[pb.WorkflowEvent]) -> dict[str, Any]:
    """What must not differ between runs (ids, paths and times naturally do)."""
    state = dict(wf.state)
    return {
        "status": wf.status,
        "last_node_id": wf.last_node_id,
        "current_step_index": state["current_step_index"],
        "attempts_by_step": dict(state["attempts_by_step"]),
        "verification": str(state["verification"]),
        "results": [
            (r["step_id"], r["attempt"], r["exit_code"], r["stdout"]) for r in state["results"]
        ],
        "events": [(e.kind, e.node_id, e.status) for e in events],
    }


async def run_once(settings: Settings, faults: str) -> tuple[dict[str, Any], int]:
    replica = await start_engine(settings.with_overrides(faults=faults, lease_ttl_seconds=3))
    try:
        task_id = new_task_id()
        spec = task(
            shell_step("one", "sleep 1.2; echo one"),
            shell_step("two", 'test "$WORKFLOW_ENGINE_ATTEMPT" -ge 2 && echo two'),
            shell_step("three", "echo three"),
        )
        await replica.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
        events = await watch_until_end(replica.stub, task_id)
        wf = await wait_for_status(replica.stub, task_id)
        # The last fault fires after the final commit, which the watch may see first.
        assert await replica.engine.runs.wait(task_id, 30)
        return outcome(wf, events), replica.engine.context.faults.fired
    finally:
        await stop_engine(replica)


async def test_faulted_run_matches_the_clean_run(settings: Settings) -> None:
    clean, _ = await run_once(settings, "")
    faulted, fired = await run_once(settings, ",".join(FAULTS))
    differences = [key for key in clean if clean[key] != faulted[key]]
    record(
        "6 commit faults",
        faults_injected=fired,
        state_differences=len(differences),
        node_events=len(clean["events"]),
    )
    assert fired == len(FAULTS)  # every fault point was reached
    assert clean["status"] == pb.SUCCEEDED
    assert differences == [], {k: (clean[k], faulted[k]) for k in differences}
