"""A client never sees where the server keeps its job directories.

Paths in what a client reads (summary, error, findings, recommended actions, results records,
history) are relative to the job's work directory. Only the stored job result keeps the
absolute `work_dir`, which the verifier needs to check files after a restart.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.protobuf import json_format

from tests.conftest import RunningEngine
from tests.support.helpers import check, new_task_id, shell_step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb


def strings(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every string in a JSON document, with the keys that lead to it."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from strings(item, (*path, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from strings(item, (*path, str(index)))


def internal_work_dir(path: tuple[str, ...]) -> bool:
    """The stored job result's own `work_dir`, the one place the absolute path may stay."""
    return path[-1] == "work_dir" and (
        path[-3:-1] == ("state", "last_result") or path[-2] == "result"
    )


def leaks(workflow: pb.Workflow, data_dir: str) -> list[tuple[tuple[str, ...], str]]:
    document = json_format.MessageToDict(workflow, preserving_proto_field_name=True)
    return [
        (path, text)
        for path, text in strings(document)
        if data_dir in text and not internal_work_dir(path)
    ]


async def run(running: RunningEngine, spec: pb.TaskSpec) -> pb.Workflow:
    task_id = new_task_id()
    await running.stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id, task=spec))
    return await wait_for_status(running.stub, task_id)


async def test_no_absolute_job_path_reaches_what_a_client_reads(running: RunningEngine) -> None:
    data_dir = str(running.engine.settings.data_dir.resolve())
    made = shell_step(
        "make",
        "mkdir out && echo hi > out/report.txt",
        expect=[check("file_exists", "out/report.txt")],
    )
    missing = shell_step("miss", "true", expect=[check("file_exists", "out/nope.txt")])

    passed = await run(running, task(made))
    failed = await run(running, task(made, missing, max_attempts_per_step=2))

    assert passed.status == pb.SUCCEEDED
    assert failed.status == pb.FAILED
    # The stored result does keep the absolute work dir (the verifier reads it), so the check
    # below would see the path if the engine copied it anywhere else.
    steps = json_format.MessageToDict(passed.state)["steps"]
    assert steps["make"]["result"]["work_dir"].startswith(data_dir)
    assert leaks(passed, data_dir) == []
    assert leaks(failed, data_dir) == []
    # What the client reads still says which file, relative to the work directory.
    findings = json_format.MessageToDict(failed.state)["steps"]["miss"]["verification"]
    [detail] = [f["detail"] for f in findings["findings"] if f["check"] == "file_exists"]
    assert "'out/nope.txt'" in detail and "missing" in detail
    assert "'out/nope.txt'" in failed.error
    assert "out/report.txt" in str(json_format.MessageToDict(passed.state)["steps"]["make"])
