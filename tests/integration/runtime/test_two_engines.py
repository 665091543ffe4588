"""Two engines in one process own their secrets and their metrics: what one learns or counts,
the other does not (`workflow_engine._context`)."""

from __future__ import annotations

from tests.conftest import RunningEngine
from tests.support.helpers import new_task_id, shell_step, task, wait_for_status
from workflow_engine._masking import MASK
from workflow_engine.v1 import workflow_engine_pb2 as pb

SECRET = "known-to-the-first-engine-only-0123"
STARTED = "workflow_engine_workflows_started_total"
NODES = "workflow_engine_node_duration_seconds_count"


async def test_two_engines_in_one_process_share_no_secret_and_no_metric(
    running: RunningEngine, second_replica: RunningEngine
) -> None:
    first, second = running.engine.context, second_replica.engine.context
    assert first.secrets is not second.secrets and first.metrics is not second.metrics
    registries = first.metrics.enable(), second.metrics.enable()
    assert registries[0] is not registries[1]
    task_id = new_task_id()
    spec = task(shell_step("use", 'echo "$TOKEN"', env={"TOKEN": SECRET}, secret_env=["TOKEN"]))
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    wf = await wait_for_status(running.stub, task_id)
    assert wf.status == pb.SUCCEEDED, wf.error
    # The first engine ran it: it knows the secret, masks it, and counted the workflow.
    assert first.secrets.redact(f"said {SECRET}") == f"said {MASK}"
    assert registries[0].get_sample_value(STARTED) == 1
    assert registries[0].get_sample_value(NODES, {"node": "plan_steps"}) == 1
    # The second never saw it.
    assert second.secrets.redact(f"said {SECRET}") == f"said {SECRET}"
    assert not registries[1].get_sample_value(STARTED)
    assert not registries[1].get_sample_value(NODES, {"node": "plan_steps"})
