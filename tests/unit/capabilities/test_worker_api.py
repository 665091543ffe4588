"""The Worker API's answers read as the engine's job results, as their node writes them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from workflow_engine.capabilities.workers import _worker_api as worker_api
from workflow_engine.domain.jobs import JobRequest, Sandbox
from workflow_engine.errors import UnreadableAnswer

JOB = JobRequest(
    task_id="11111111-1111-4111-8111-111111111111",
    job_id="22222222-2222-4222-8222-222222222222",
    sandbox=Sandbox(command=("make", "test"), env={"K": "v", "WORKFLOW_ENGINE_ATTEMPT": "9"}),
    attempt=2,
    step_id="test",
    remediation=("make the command exit with the expected code",),
    context=({"step_id": "build", "output": "ok"},),
)


def answer(**fields: Any) -> dict[str, Any]:
    """A result as their worker node encodes it (exit_code 0 left out)."""
    return {
        "version": 1,
        "task_id": JOB.task_id,
        "job_id": JOB.job_id,
        "status": "completed",
        "stdout": "out",
        "stderr": "",
        "started_at": "2026-01-01T00:00:00Z",
        "ended_at": "2026-01-01T00:00:01Z",
        "truncated": {"stdout": False, "stderr": False},
        **fields,
    }


def test_an_omitted_exit_code_is_zero_and_their_extra_fields_are_ignored() -> None:
    result = worker_api.read_result(
        JOB,
        "node-1",
        answer(
            sba_result={"protocol_version": "1", "steps": []},
            step_executor_result={"status": "ok"},
            run_diagnostics={"runtime": "podman", "runtime_argv": ["podman", "run"]},
        ),
    )
    assert (result.status, result.exit_code, result.stdout) == ("completed", 0, "out")
    assert (result.target, result.work_dir, result.job_id) == ("node-1", None, JOB.job_id)
    assert result.started_at == "2026-01-01T00:00:00Z"


def test_a_failed_job_keeps_its_exit_code_and_a_timeout_has_none() -> None:
    failed = worker_api.read_result(JOB, "n", answer(status="failed", exit_code=2))
    assert (failed.status, failed.exit_code) == ("failed", 2)
    timed_out = worker_api.read_result(JOB, "n", answer(status="timeout", exit_code=-1))
    assert (timed_out.status, timed_out.exit_code) == ("timeout", None)


def test_truncation_flags_and_artifacts_as_links() -> None:
    result = worker_api.read_result(
        JOB,
        "n",
        answer(
            truncated={"stdout": True, "stderr": False},
            artifacts=[
                {"name": "report.html", "size_bytes": 5, "content_base64": "aGVsbG8=", "ref": "r"},
                "s3://bucket/log.txt",
                42,
            ],
        ),
    )
    assert (result.truncated.stdout, result.truncated.stderr) == (True, False)
    assert result.artifacts == (
        {"name": "report.html", "size_bytes": 5, "ref": "r"},
        {"ref": "s3://bucket/log.txt"},
    )


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ([], "JSON object"),
        (answer(status="running"), "status"),
        (answer(job_id="33333333-3333-4333-8333-333333333333"), "job_id"),
        (answer(exit_code="0"), "exit_code"),
        (answer(exit_code=True), "exit_code"),
        (answer(stdout=5), "stdout"),
        (answer(truncated=[True]), "truncated"),
    ],
)
def test_an_answer_that_is_not_a_result_is_refused_naming_the_field(body: Any, names: str) -> None:
    with pytest.raises(UnreadableAnswer, match=names):
        worker_api.read_result(JOB, "n", body)


def test_problem_documents_become_one_line_with_title_and_detail() -> None:
    document = {
        "type": "urn:cynodeai:error:validation",
        "title": "Bad Request",
        "status": 400,
        "detail": "sandbox.command is required when job_spec_json is not set",
    }
    assert worker_api.problem_message(400, "Bad Request", json.dumps(document).encode()) == (
        "HTTP 400 Bad Request: sandbox.command is required when job_spec_json is not set"
    )
    custom = {"title": "Quota", "detail": "too many jobs"}
    assert worker_api.problem_message(429, "Too Many Requests", json.dumps(custom).encode()) == (
        "HTTP 429 Too Many Requests: Quota: too many jobs"
    )
    assert worker_api.problem_message(502, "Bad Gateway", b"<html>\n upstream </html>") == (
        "HTTP 502 Bad Gateway: <html> upstream </html>"
    )
    assert worker_api.problem_message(500, "Internal Server Error", b"") == (
        "HTTP 500 Internal Server Error"
    )
    assert len(worker_api.problem_message(400, "Bad Request", b"x" * 5000)) == 300


def test_the_request_has_the_contract_fields_and_the_engines_variables() -> None:
    body = worker_api.request_body(JOB, 600)
    assert (body["version"], body["task_id"], body["job_id"]) == (1, JOB.task_id, JOB.job_id)
    sandbox = body["sandbox"]
    assert sandbox["command"] == ["make", "test"]
    assert (sandbox["timeout_seconds"], sandbox["network_policy"]) == (600, "restricted")
    env = sandbox["env"]
    assert env["K"] == "v"
    assert env["WORKFLOW_ENGINE_ATTEMPT"] == "2"  # the step's env cannot override the engine's
    assert env["WORKFLOW_ENGINE_JOB_ID"] == JOB.job_id
    assert json.loads(env["WORKFLOW_ENGINE_REMEDIATION"]) == list(JOB.remediation)
    assert json.loads(env["WORKFLOW_ENGINE_CONTEXT"]) == [{"step_id": "build", "output": "ok"}]
    assert worker_api.cancel_path("a/b") == "/v1/worker/jobs/a%2Fb:cancel"
    # The run goes only when there is one (a workflow an engine before format 4 started).
    assert "run_id" not in body
    run_id = "33333333-3333-4333-8333-333333333333"
    assert worker_api.request_body(JOB.model_copy(update={"run_id": run_id}), 1)["run_id"] == (
        run_id
    )
