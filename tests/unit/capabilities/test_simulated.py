"""The simulated worker: Worker API results without processes, deduplicated by job id."""

from __future__ import annotations

import time

from workflow_engine.capabilities.workers._simulated import SimulatedWorker
from workflow_engine.domain import JobRequest, Sandbox


def job(*argv: str, job_id: str = "j1") -> JobRequest:
    return JobRequest(task_id="t", job_id=job_id, sandbox=Sandbox(command=argv))


async def test_true_echo_sleep_and_unknown() -> None:
    worker = SimulatedWorker()
    assert (await worker.run("x", job("true"))).exit_code == 0
    echoed = await worker.run("x", job("echo", "a", "b", job_id="j2"))
    assert (echoed.status, echoed.stdout) == ("completed", "a b\n")
    t0 = time.perf_counter()
    slept = await worker.run("x", job("sleep", "0.2", job_id="j3"))
    assert slept.status == "completed" and time.perf_counter() - t0 >= 0.2
    missing = await worker.run("x", job("rm", "-rf", "/", job_id="j4"))
    assert (missing.status, missing.exit_code) == ("failed", 127)


async def test_same_job_id_returns_the_first_result() -> None:
    worker = SimulatedWorker()
    first = await worker.run("x", job("echo", "first"))
    again = await worker.run("x", job("echo", "second"))
    assert again is first
