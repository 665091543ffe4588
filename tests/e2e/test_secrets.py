"""A run that uses secrets shows them nowhere: no log line of the engine, no answer, no event,
no error. The job itself gets the real value."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import grpc
from google.protobuf import json_format

from tests.support.engine_process import EngineProcess
from tests.support.helpers import check, new_task_id, step, task, wait_for_status, write_secret
from workflow_engine._masking import MASK
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc


async def test_secrets_appear_in_no_log_line_and_no_answer(
    db_url: str, tmp_path: Path, processes: list[EngineProcess]
) -> None:
    secret = f"s3cret-{uuid.uuid4().hex}"
    token = f"caller-token-{uuid.uuid4().hex}"
    tokens = tmp_path / "tokens.json"
    write_secret(
        tokens,
        json.dumps({"callers": [{"identity": "ci", "role": "orchestrator", "token": token}]}),
    )
    engine = EngineProcess(
        db_url=db_url,
        data_dir=tmp_path / "data",
        holder_id="secrets",
        extra_env={
            "WORKFLOW_ENGINE_TOKENS_FILE": str(tokens),
            "WORKFLOW_ENGINE_LOG_LEVEL": "debug",
        },
    )
    processes.append(engine)
    env = {"API_TOKEN": secret, "REGION": "eu-west"}
    digest = hashlib.sha256(secret.encode()).hexdigest()
    spec = task(
        # The job gets the real value (its digest is checked), and prints it too.
        step(
            "use",
            "sh",
            "-c",
            'printf %s "$API_TOKEN" | sha256sum; echo "token=$API_TOKEN region=$REGION"',
            env=env,
            secret_env=["API_TOKEN"],
            expect=[check("stdout_contains", digest)],
        ),
        # A step that fails with the secret on stderr: the verification's findings, the
        # retries and the workflow's error all quote what it printed.
        step(
            "leak",
            "sh",
            "-c",
            'echo "cannot use $API_TOKEN" >&2; exit 3',
            env=env,
            secret_env=["API_TOKEN"],
            expect=[check("stderr_contains", "all good")],
        ),
        max_attempts_per_step=2,
    )
    md = [("authorization", f"Bearer {token}")]
    answers: list[str] = []
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        task_id = new_task_id()
        started = await stub.StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=spec), metadata=md
        )
        answers.append(json_format.MessageToJson(started))
        events = [
            e
            async for e in stub.WatchWorkflow(pb.WatchWorkflowRequest(task_id=task_id), metadata=md)
        ]
        answers += [json_format.MessageToJson(e) for e in events]
        wf = await wait_for_status(stub, task_id, metadata=md)
        answers.append(json_format.MessageToJson(wf))
        listed = await stub.ListWorkflows(pb.ListWorkflowsRequest(), metadata=md)
        answers.append(json_format.MessageToJson(listed))
        try:
            await stub.CancelWorkflow(pb.CancelWorkflowRequest(task_id=task_id), metadata=md)
        except grpc.aio.AioRpcError as exc:
            answers.append(exc.details() or "")
    assert engine.terminate() == 0

    assert wf.status == pb.FAILED
    state = json_format.MessageToDict(wf.state)
    assert state["steps"]["use"]["status"] == "passed"  # the job had the real value
    assert state["plan"]["steps"][0]["env"] == {"API_TOKEN": MASK, "REGION": "eu-west"}
    assert f"token={MASK} region=eu-west" in state["steps"]["use"]["result"]["stdout"]
    assert MASK in wf.error or MASK in json.dumps(state["steps"]["leak"])
    logs = json.dumps(engine.logs)
    assert "sandbox_job_started" in logs  # the debug log of the run is there
    for text in [*answers, logs]:
        assert secret not in text
        assert token not in text
