"""Masking a workflow's secrets costs no tenant the event loop.

Attacker: a tenant, who chooses how many secrets its task has (`secret_env` values) and what
its jobs print. Every answer masks each secret, in each of its forms, in every string it shows:
with 2,000 secrets a single GetWorkflow held the event loop for 4 to 8 s, and every tenant's
calls and health checks waited. Now a task names at most 256 secret values
(`MAX_SECRETS`, INVALID_ARGUMENT naming ``task.steps``, nothing stored); one RE2 program
matches all of a workflow's secrets at once; and a state with secrets is shown off the event
loop. A row an older engine stored with more secrets is still shown, masked, without a stall.
"""

from __future__ import annotations

import json
import uuid

import grpc
import psycopg
import pytest
from google.protobuf import json_format

from tests.conftest import RunningEngine
from tests.security.conftest import as_caller, tenant_task
from tests.security.stalls import HealthWatch
from tests.support.helpers import new_task_id, shell_step, snapshot, wait_for_status
from workflow_engine._masking import MASK
from workflow_engine.config import Settings
from workflow_engine.domain.steps import MAX_SECRET_CHARS, MAX_SECRETS
from workflow_engine.v1 import workflow_engine_pb2 as pb

A = as_caller("a-orchestrator")
#: The longest a health check may wait while the engine answers (as `test_model_answers`).
MAX_STALL_SECONDS = 0.5


def many_secrets(steps: int, per_step: int) -> pb.TaskSpec:
    """A task of `steps` steps, each with `per_step` secret variables, printing one of them."""
    spec = tenant_task("project-a")
    for i in range(steps):
        env = {f"S{j}": f"secret-{i}-{j}-{uuid.uuid4().hex}" for j in range(per_step)}
        spec.steps.append(
            shell_step(f"s{i}", 'echo "$S0"; head -c 20000 /dev/zero | tr "\\0" x', env=env)
        )
        spec.steps[-1].secret_env.extend(env)
    return spec


async def test_a_task_with_more_secrets_than_the_limit_is_refused(
    served: RunningEngine, db_url: str
) -> None:
    before = await snapshot(db_url)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await served.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=new_task_id(), task=many_secrets(20, 100)), metadata=A
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details() or ""
    assert details.startswith(f"task.steps: more than {MAX_SECRETS} secret values"), details
    assert await snapshot(db_url) == before


async def add_secrets_as_an_older_engine(settings: Settings, task_id: str, count: int) -> str:
    """Give the stored row `count` more secrets, one of them in the first step's output, as an
    engine without the limit could have stored them; the one printed."""
    extra = [f"old-secret-{i}-{uuid.uuid4().hex}" for i in range(count)]
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        await conn.execute("SET session_replication_role = replica")
        cur = await conn.execute(
            "SELECT state FROM workflow_checkpoints WHERE task_id = %s", (task_id,)
        )
        row = await cur.fetchone()
        assert row is not None
        state = row[0]
        state["secrets"] = sorted({*state.get("secrets", []), *extra})
        state["steps"]["s0"]["result"]["stdout"] += extra[7] + "\n"
        await conn.execute(
            "UPDATE workflow_checkpoints SET state = %s WHERE task_id = %s",
            (json.dumps(state), task_id),
        )
    return extra[7]


async def test_a_task_with_more_secret_characters_than_the_limit_is_refused(
    served: RunningEngine, db_url: str
) -> None:
    before = await snapshot(db_url)
    spec = tenant_task("project-a", shell_step("s", "true", env={"A": "a" * 40_000}))
    spec.steps[0].env["B"] = "b" * 30_000
    spec.steps[0].secret_env.extend(["A", "B"])
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await served.stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=new_task_id(), task=spec), metadata=A
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details() or ""
    assert details.startswith(f"task.steps: secret values of more than {MAX_SECRET_CHARS}"), details
    assert await snapshot(db_url) == before


@pytest.mark.timing
async def test_answering_a_workflow_with_many_secrets_does_not_stall_the_loop(
    served: RunningEngine, secured: Settings
) -> None:
    # A secret that repeats itself (a DFA of its forms took 27 s to build; a regular
    # expression's ran out of memory), alone in its task, beside 100 KB of output built
    # against it; then the most a task may have: 256 secrets over 16 steps of 20 KB output.
    repeats = shell_step(
        "repeats",
        "head -c 99999 /dev/zero | tr '\\0' \"'\"; echo b",
        env={"R": "'" * 30_000},
        secret_env=["R"],
    )
    spec = many_secrets(16, MAX_SECRETS // 16)
    task_id = new_task_id()
    async with HealthWatch(served.channel) as running:  # every checkpoint write masks too
        for tid, task in ((new_task_id(), tenant_task("project-a", repeats)), (task_id, spec)):
            await served.stub.StartWorkflow(
                pb.StartWorkflowRequest(task_id=tid, task=task), metadata=A
            )
            await wait_for_status(served.stub, tid, metadata=A)
    assert running.worst < MAX_STALL_SECONDS, f"the event loop stalled {running.worst:.3f} s"
    # ... and a row an older engine stored with 2,000 more.
    printed = await add_secrets_as_an_older_engine(secured, task_id, 2000)

    async with HealthWatch(served.channel) as watch:
        for _ in range(3):
            wf = await served.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id), metadata=A)
    assert watch.worst < MAX_STALL_SECONDS, f"the event loop stalled {watch.worst:.3f} s"
    state = json_format.MessageToDict(wf.state)
    stdout = state["steps"]["s0"]["result"]["stdout"]
    assert printed not in stdout and MASK in stdout, stdout[-200:]
    assert spec.steps[0].env["S0"] not in json.dumps(state)
