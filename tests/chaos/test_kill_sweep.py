"""Case 1: kill -9 at every node boundary of a three-step workflow, resume, compare."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.chaos.conftest import FULL, record
from tests.support.engine_process import EngineProcess
from tests.support.helpers import new_task_id, open_to_jobs, shell_step, task, wait_for_status
from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

NODES = [
    ("load_task_context", 1),
    ("plan_steps", 1),
    *[
        (node, i)
        for i in (1, 2, 3)
        for node in ("dispatch_step", "collect_result", "verify_step_result")
    ],
    ("finalize_summary", 1),
]
ALL = [(point, node, n) for node, n in NODES for point in ("before", "after")]
FAST = [
    ("before", "plan_steps", 1),
    ("after", "dispatch_step", 2),
    ("before", "collect_result", 2),
    ("before", "finalize_summary", 1),
]
SCENARIOS = ALL if FULL else FAST
_outcomes: list[tuple[str, bool, int]] = []


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return open_to_jobs(tmp_path_factory.mktemp("sweep"))


@pytest.fixture
def resumer(db_url: str, shared_dir: Path) -> Iterator[EngineProcess]:
    """The replica that resumes each killed run (same holder id: it may take over at once)."""
    proc = EngineProcess(
        db_url=db_url, data_dir=shared_dir / "data", holder_id="sweep", recovery=False
    )
    yield proc
    proc.kill()


@pytest.mark.parametrize(
    ("point", "node", "nth"), SCENARIOS, ids=[f"{p}-{n}#{k}" for p, n, k in SCENARIOS]
)
async def test_kill_at_node_boundary_then_resume(
    db_url: str, shared_dir: Path, resumer: EngineProcess, point: str, node: str, nth: int
) -> None:
    jobs_file = shared_dir / f"jobs-{point}-{node}-{nth}.txt"
    spec = task(
        *(
            shell_step(f"step-{i}", f'echo "$WORKFLOW_ENGINE_JOB_ID" >> {jobs_file}; sleep 0.2')
            for i in (1, 2, 3)
        )
    )
    task_id = new_task_id()
    victim = EngineProcess(
        db_url=db_url,
        data_dir=shared_dir / "data",
        holder_id="sweep",
        recovery=False,
        faults=f"kill:{point}:{node}#{nth}",
    )
    async with grpc.aio.insecure_channel(victim.address) as channel:
        await pb_grpc.WorkflowEngineStub(channel).StartWorkflow(
            pb.StartWorkflowRequest(task_id=task_id, task=spec)
        )
    assert await asyncio.to_thread(victim.proc.wait, 60) == -9  # it died at the fault

    async with grpc.aio.insecure_channel(resumer.address) as channel:
        stub = pb_grpc.WorkflowEngineStub(channel)
        await stub.ResumeWorkflow(pb.ResumeWorkflowRequest(task_id=task_id, holder_id="sweep"))
        wf = await wait_for_status(stub, task_id, timeout=60)
    runs = Counter(jobs_file.read_text().split())
    _outcomes.append((f"{point}:{node}#{nth}", wf.status == pb.SUCCEEDED, max(runs.values())))
    completed = sum(ok for _, ok, _ in _outcomes)
    record(
        "1 kill -9 sweep",
        scenarios=len(_outcomes),
        completion_rate=round(completed / len(_outcomes), 3),
        max_runs_of_one_job_id=max(m for _, _, m in _outcomes),
    )
    assert wf.status == pb.SUCCEEDED, wf.error
    assert len(runs) == 3  # one job per step: no attempt was lost or repeated
    assert max(runs.values()) == 1
