"""The node's request checks and answer shape, without a server."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from workflow_engine.domain import JobResult
from workflow_engine.errors import InvalidArgument
from workflow_engine.worker_node._run_request import parse_run_request, response_body


def body(**sandbox: Any) -> dict[str, Any]:
    return {
        "version": 1,
        "task_id": str(uuid.uuid4()),
        "job_id": str(uuid.uuid4()),
        "sandbox": {"command": ["true"], **sandbox},
    }


@pytest.mark.parametrize(
    ("asked", "default", "cap", "runs_for"),
    [(0, 300, 3600, 300), (60, 300, 3600, 60), (9000, 300, 3600, 3600), (0, 300, 100, 100)],
)
def test_the_timeout_is_made_explicit_and_capped(
    asked: int, default: int, cap: int, runs_for: int
) -> None:
    job = parse_run_request(body(timeout_seconds=asked)).to_job(
        default_timeout=default, max_timeout=cap
    )
    assert job.sandbox.timeout_seconds == runs_for


def test_defaults_and_canonical_ids() -> None:
    data = body(network_policy="")
    data["job_id"] = data["job_id"].upper()
    job = parse_run_request(data).to_job(default_timeout=1, max_timeout=1)
    assert job.job_id == data["job_id"].lower()
    assert (job.sandbox.network_policy, job.sandbox.image, job.sandbox.env) == (
        "restricted",
        "",
        {},
    )
    assert job.attempt == 1


def test_true_is_not_version_1() -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_run_request(body() | {"version": True})
    assert caught.value.field == "version"


def test_the_answer_echoes_the_request_and_keeps_local_paths_in() -> None:
    job = parse_run_request(body()).to_job(default_timeout=1, max_timeout=1)
    result = JobResult(
        task_id="recorded-by-a-cancel",
        job_id=job.job_id,
        status="completed",
        exit_code=0,
        work_dir="/srv/node/jobs/x/work",
        target="local",
    )
    answer = response_body(result, job)
    assert answer["task_id"] == job.task_id and answer["exit_code"] == 0
    assert "work_dir" not in answer and "target" not in answer
    assert set(answer) == {
        "version",
        "task_id",
        "job_id",
        "status",
        "exit_code",
        "stdout",
        "stderr",
        "started_at",
        "ended_at",
        "truncated",
    }


def test_the_run_keys_the_workspace_and_must_be_a_uuid() -> None:
    """The engine's `run_id` keys the job's user and /tmp with its task; a node is sent one
    by our engine only, and an older engine sends none (the task alone then)."""
    data = body()
    assert (
        parse_run_request(data).to_job(default_timeout=1, max_timeout=1).workspace
        == (data["task_id"])
    )
    run_id = str(uuid.uuid4())
    job = parse_run_request(data | {"run_id": run_id.upper()}).to_job(
        default_timeout=1, max_timeout=1
    )
    assert (job.run_id, job.workspace) == (run_id, f"{data['task_id']}/{run_id}")
    for bad in ("../x", 7, "x" * 40):
        with pytest.raises(InvalidArgument) as caught:
            parse_run_request(data | {"run_id": bad})
        assert caught.value.field == "run_id"
