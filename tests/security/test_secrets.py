"""A workflow's secrets stay masked in everything a reader is shown, whatever an operator edits
and however the engine or a job quotes or cuts them.

The attackers: an operator (``a-operator``) who edits the plan to unmask a secret, and a reader
(``a-reader``) who searches every answer (GetWorkflow with its history, ListWorkflows, the
WatchWorkflow stream) for any 8 characters of a secret (`MIN_MASKED_CHARS`), raw or escaped as
`repr` and `json.dumps` write it. The jobs are real: they print the secrets they were given.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf import json_format
from google.protobuf.message import Message

from tests.conftest import RunningEngine
from tests.security.conftest import as_caller, tenant_task
from tests.support.helpers import (
    JOB_PYTHON,
    check,
    new_task_id,
    shell_step,
    snapshot,
    step,
    struct,
    wait_for_status,
)
from workflow_engine._masking import MASK, MIN_MASKED_CHARS
from workflow_engine.config import Settings
from workflow_engine.v1 import workflow_engine_pb2 as pb

READER = as_caller("a-reader")
OPERATOR = as_caller("a-operator")


def pieces(secret: str) -> set[str]:
    """Every `MIN_MASKED_CHARS` characters of `secret` as it reads raw, and quoted by `repr`,
    `ascii` and `json.dumps` (either way)."""
    forms = {
        secret,
        repr(secret)[1:-1],
        ascii(secret)[1:-1],
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
    }
    n = MIN_MASKED_CHARS
    return {form[i : i + n] for form in forms for i in range(len(form) - n + 1)}


def shown_strings(messages: Iterable[Message]) -> Iterator[str]:
    """Every string a client reads in `messages`, and each message serialized as JSON."""
    stack: list[Any] = []
    for message in messages:
        yield json_format.MessageToJson(message)
        stack.append(json_format.MessageToDict(message))
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def assert_never_shown(secrets: Iterable[str], messages: Iterable[Message]) -> None:
    texts = list(shown_strings(messages))
    for secret in secrets:
        for piece in pieces(secret):
            leaks = [text for text in texts if piece in text]
            at = [t[max(0, t.index(piece) - 100) : t.index(piece) + 100] for t in leaks]
            assert not leaks, f"{piece!r} of {secret!r} is shown: {at}"


async def reader_answers(served: RunningEngine, task_id: str) -> list[Message]:
    """Everything `a-reader` may read of an ended workflow."""
    wf = await served.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id), metadata=READER)
    listed = await served.stub.ListWorkflows(
        pb.ListWorkflowsRequest(project_id="project-a"), metadata=READER
    )
    watch = served.stub.WatchWorkflow(pb.WatchWorkflowRequest(task_id=task_id), metadata=READER)

    async def events() -> list[pb.WorkflowEvent]:
        return [event async for event in watch]

    return [wf, listed, *await asyncio.wait_for(events(), 30)]


async def set_plan(
    served: RunningEngine, task_id: str, plan: dict[str, Any], who: str = "a-orchestrator"
) -> pb.Workflow:
    """A plan edit (the orchestrator's: an operator may not set the plan, `test_roles.py`)."""
    request = pb.UpdateWorkflowRequest(
        task_id=task_id, operator="mallory", set_state=struct({"plan": plan})
    )
    answer = await served.stub.UpdateWorkflow(request, metadata=as_caller(who))
    return answer  # type: ignore[no-any-return]


async def stored_state(settings: Settings, task_id: str) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        cur = await conn.execute(
            "SELECT state FROM workflow_checkpoints WHERE task_id = %s", (task_id,)
        )
        row = await cur.fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


async def forget_kept_secrets(settings: Settings, task_id: str) -> None:
    """Make the row what an engine before the state's `secrets` field wrote (no triggers fire:
    this is that engine's write, not another writer's)."""
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        await conn.execute("SET session_replication_role = replica")
        await conn.execute(
            "UPDATE workflow_checkpoints SET state = state - 'secrets' WHERE task_id = %s",
            (task_id,),
        )


@pytest.mark.parametrize("written_before", [False, True], ids=["kept", "row-from-before"])
async def test_a_plan_edit_neither_drops_a_secret_nor_unmasks_one(
    served: RunningEngine, secured: Settings, written_before: bool
) -> None:
    used, dropped = f"used-{uuid.uuid4().hex}", f"dropped-{uuid.uuid4().hex}"
    spec = tenant_task(
        "project-a",
        # Passes: its secret is in its job's env, its output, the context and the results.
        shell_step("use", 'echo "token=$TOKEN"', env={"TOKEN": used}, secret_env=["TOKEN"]),
        # Fails once, printing its secret; the budget then suspends the workflow.
        shell_step(
            "flaky",
            'echo "other=$OTHER"; echo "other=$OTHER" >&2; exit 1',
            env={"OTHER": dropped},
            secret_env=["OTHER"],
        ),
    )
    spec.max_attempts_per_step = 2
    spec.budget.max_dispatches = 2
    task_id = new_task_id()
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=spec), metadata=as_caller("a-orchestrator")
    )
    await wait_for_status(served.stub, task_id, {pb.SUSPENDED}, metadata=READER)
    if written_before:
        assert "secrets" in await stored_state(secured, task_id)
        await forget_kept_secrets(secured, task_id)
    seen = await served.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id), metadata=OPERATOR)
    plan = json_format.MessageToDict(seen.state)["plan"]
    assert plan["steps"][0]["env"] == {"TOKEN": MASK}

    with pytest.raises(grpc.aio.AioRpcError) as not_theirs:
        await set_plan(served, task_id, plan, who="a-operator")
    assert not_theirs.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # The plan as its editor sees it, without `use`'s secret_env, or with another value.
    unmarked = json.loads(json.dumps(plan))
    unmarked["steps"][0]["secret_env"] = []
    changed = json.loads(json.dumps(plan))
    changed["steps"][0]["env"]["TOKEN"] = "a-value-of-my-own"
    for edit, field in ((unmarked, ".secret_env"), (changed, ".env")):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await set_plan(served, task_id, edit)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"set_state.plan.steps[0]{field}" in (refused.value.details() or "")
    after = await served.stub.GetWorkflow(pb.GetWorkflowRequest(task_id=task_id), metadata=READER)
    assert after.state == seen.state and len(after.history) == len(seen.history)

    # Dropping the pending step is allowed: its secret leaves the plan but stays masked. The
    # plan sent back as shown keeps `use`'s secret as stored.
    updated = await set_plan(served, task_id, {**plan, "steps": plan["steps"][:1]})
    stored = await stored_state(secured, task_id)
    assert stored["plan"]["steps"][0]["env"] == {"TOKEN": used}
    assert stored["secrets"] == sorted([used, dropped])
    cancelled = await served.stub.CancelWorkflow(
        pb.CancelWorkflowRequest(task_id=task_id), metadata=OPERATOR
    )

    answers = [seen, updated, cancelled, *await reader_answers(served, task_id)]
    assert_never_shown([used, dropped], answers)
    state = json_format.MessageToDict(answers[3].state)  # the reader's GetWorkflow
    assert "secrets" not in state
    assert state["steps"]["use"]["result"]["stdout"] == f"token={MASK}\n"
    assert state["context"]["use"]["output"] == f"token={MASK}\n"
    assert state["steps"]["flaky"]["result"]["stderr"] == f"other={MASK}\n"
    assert state["steps"]["flaky"]["job"]["request"]["sandbox"]["env"] == {"OTHER": MASK}


# Each secret breaks a different quoting: a backslash, quotes, control characters, non-ASCII
# letters. The job prints them raw on stderr and as JSON on stdout, and one of them again where
# the verifier cuts what it quotes (200 characters).
LEAK = """
import json, os, sys
values = {k: os.environ[k] for k in ("B", "Q", "C", "N")}
print(json.dumps({**values, "P": "." * 190 + values["N"]}))
print(" ".join(values.values()).ljust(190, ".") + values["B"], file=sys.stderr)
sys.exit(3)
"""


async def test_secrets_that_quoting_escapes_are_masked_before_anything_quotes_or_cuts_them(
    served: RunningEngine,
) -> None:
    tag = uuid.uuid4().hex[:8]
    secrets = {
        "B": f"back\\slash-{tag}",
        "Q": f"dq\"it's-{tag}",
        "C": f"ctl\n\t\x1b-{tag}",
        "N": f"gr\u00fc\u00dfe-\u2603-{tag}",
    }
    spec = tenant_task(
        "project-a",
        step(
            "leak",
            JOB_PYTHON,
            "-c",
            LEAK,
            env=secrets,
            secret_env=sorted(secrets),
            expect=[
                check("stderr_contains", "all good"),
                *(check("json_field_equals", field=k, equals="x") for k in [*secrets, "P"]),
            ],
        ),
    )
    spec.max_attempts_per_step = 1
    task_id = new_task_id()
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=spec), metadata=as_caller("a-orchestrator")
    )
    wf = await wait_for_status(served.stub, task_id, metadata=READER)
    assert wf.status == pb.FAILED

    answers = await reader_answers(served, task_id)
    assert_never_shown(secrets.values(), answers)
    # The findings quoted the output (masked), and the error and the summary carry them.
    assert f"got '{MASK} {MASK} {MASK} {MASK}..." in wf.error
    assert f'got "{MASK}"' in wf.error and MASK in wf.summary
    listed = [w for w in answers[1].workflows if w.task_id == task_id]  # type: ignore[attr-defined]
    assert MASK in listed[0].error


async def test_a_secret_cut_by_a_truncation_is_masked_where_it_was_cut(
    served: RunningEngine,
) -> None:
    secret = f"cut-in-half-{uuid.uuid4().hex}"
    # The results keep the last 2000 characters of stdout: the secret's last 19, then 1980
    # zeros and a newline.
    spec = tenant_task(
        "project-a",
        shell_step(
            "long",
            'printf "%s%01980d\\n" "$TOKEN" 0',
            env={"TOKEN": secret},
            secret_env=["TOKEN"],
        ),
    )
    task_id = new_task_id()
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=spec), metadata=as_caller("a-orchestrator")
    )
    wf = await wait_for_status(served.stub, task_id, metadata=READER)
    assert wf.status == pb.SUCCEEDED, wf.error

    assert_never_shown([secret], await reader_answers(served, task_id))
    (result,) = json_format.MessageToDict(wf.state)["results"]
    assert result["stdout"].startswith(MASK + "0000")


async def test_the_engines_own_credentials_are_masked_in_a_workflows_state(
    served: RunningEngine,
) -> None:
    # Another caller's token, which a tenant put in a step's env without marking it secret.
    token = as_caller("b-orchestrator")[0][1].removeprefix("Bearer ")
    spec = tenant_task("project-a", shell_step("echo", 'echo "$NOTE"', env={"NOTE": token}))
    task_id = new_task_id()
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=spec), metadata=as_caller("a-orchestrator")
    )
    wf = await wait_for_status(served.stub, task_id, metadata=READER)
    assert wf.status == pb.SUCCEEDED, wf.error

    assert_never_shown([token], await reader_answers(served, task_id))
    (result,) = json_format.MessageToDict(wf.state)["results"]
    assert result["stdout"] == f"{MASK}\n"


async def test_an_edit_decision_cannot_change_a_secret(
    served: RunningEngine, secured: Settings, db_url: str
) -> None:
    # The operator approves with an EDIT whose env gives the secret a value of its choosing:
    # the job would run with it while every answer shows [secret]. Refused, naming the field,
    # and so is the secret's own value (else a refusal would tell a guess right from wrong);
    # sent as shown, the secret keeps its value and the edit takes.
    secret = f"deploy-key-{uuid.uuid4().hex}"
    spec = tenant_task(
        "project-a",
        shell_step(
            "ship",
            'echo "key=$KEY mode=$MODE"',
            env={"KEY": secret, "MODE": "dry"},
            secret_env=["KEY"],
            requires_approval=True,
        ),
    )
    task_id = new_task_id()
    await served.stub.StartWorkflow(
        pb.StartWorkflowRequest(task_id=task_id, task=spec), metadata=as_caller("a-orchestrator")
    )
    await wait_for_status(served.stub, task_id, {pb.WAITING_FOR_APPROVAL}, metadata=READER)
    before = await snapshot(db_url)
    for value in ("a-value-of-my-own", secret):
        mine = pb.ApprovalDecision(
            step_id="ship", verdict=pb.EDIT, env={"KEY": value, "MODE": "live"}
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await served.stub.ResumeWorkflow(
                pb.ResumeWorkflowRequest(task_id=task_id, decision=mine), metadata=OPERATOR
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = refused.value.details() or ""
        assert details.startswith("decision.env[KEY]: ") and secret not in details, details
    assert await snapshot(db_url) == before

    shown = pb.ApprovalDecision(step_id="ship", verdict=pb.EDIT, env={"KEY": MASK, "MODE": "live"})
    await served.stub.ResumeWorkflow(
        pb.ResumeWorkflowRequest(task_id=task_id, decision=shown), metadata=OPERATOR
    )
    await wait_for_status(served.stub, task_id, metadata=READER)
    stored = await stored_state(secured, task_id)
    assert stored["steps"]["ship"]["result"]["stdout"] == f"key={secret} mode=live\n"
