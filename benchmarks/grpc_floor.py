"""What grpc.aio itself costs per workflow on this machine, with nothing behind the calls.

A server with the engine's own service answers `StartWorkflow` at once and streams canned
`WorkflowEvent`s from `WatchWorkflow` (as many as a workflow of `make bench` sends: 14 when
watching every event, 2 when watching the outcome); a client like `compare.py`'s drives it at
the same concurrency. The CPU of each side per workflow is the least a Python gRPC server and
client pay for those calls and messages, which the engine's gRPC rows in `make bench` pay on
top of the engine's own work. (The messages here go back to back; the engine's are spread
over the workflow's life, so each costs it a little more.)

    .venv/bin/python benchmarks/grpc_floor.py [--workflows 3000] [--concurrency 20]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import psutil
from contenders import free_port
from google.protobuf.timestamp_pb2 import Timestamp

from workflow_engine.v1 import workflow_engine_pb2 as pb
from workflow_engine.v1 import workflow_engine_pb2_grpc as pb_grpc

EVERY_EVENT = 14  # 12 nodes and 2 status changes
OUTCOME_ONLY = 2  # RUNNING and SUCCEEDED


class CannedEngine(pb_grpc.WorkflowEngineServicer):
    """The engine's service with nothing behind it."""

    def __init__(self, events: int) -> None:
        self.events = events

    async def StartWorkflow(self, request: Any, context: Any) -> pb.StartWorkflowResponse:
        return pb.StartWorkflowResponse(
            task_id=request.task_id,
            run_id=str(uuid.uuid4()),
            lease_id=str(uuid.uuid4()),
            status=pb.STARTED,
            workflow_status=pb.RUNNING,
        )

    async def WatchWorkflow(self, request: Any, context: Any) -> AsyncIterator[pb.WorkflowEvent]:
        run_id = str(uuid.uuid4())
        for seq in range(1, self.events + 1):
            last = seq == self.events
            stamp = Timestamp()
            stamp.GetCurrentTime()
            yield pb.WorkflowEvent(
                task_id=request.task_id,
                sequence=seq,
                kind=pb.STATUS_CHANGED if last else pb.NODE_COMPLETED,
                node_id="" if last else "verify_step_result",
                status=pb.SUCCEEDED if last else pb.RUNNING,
                time=stamp,
                run_id=run_id,
            )


def serve(port: int, events: int, ready: Any) -> None:
    async def main() -> None:
        server = grpc.aio.server()
        pb_grpc.add_WorkflowEngineServicer_to_server(CannedEngine(events), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


async def drive(port: int, workflows: int, concurrency: int) -> None:
    # As compare.py's gRPC contenders: a connection per 5 concurrent workflows.
    channels = [
        grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(max(1, concurrency // 5))
    ]
    stubs = [pb_grpc.WorkflowEngineStub(c) for c in channels]
    queue = iter(range(workflows))

    async def lane() -> None:
        for i in queue:
            stub = stubs[i % len(stubs)]
            task_id = str(uuid.uuid4())
            await stub.StartWorkflow(pb.StartWorkflowRequest(task_id=task_id))
            events = [e async for e in stub.WatchWorkflow(pb.WatchWorkflowRequest(task_id=task_id))]
            assert events[-1].status == pb.SUCCEEDED

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    for channel in channels:
        await channel.close()


def measure(events: int, workflows: int, concurrency: int) -> dict[str, Any]:
    port = free_port()
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=serve, args=(port, events, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the canned server did not start")
        asyncio.run(drive(port, min(workflows, 200), concurrency))  # warm up
        proc = psutil.Process(server.pid)
        server0, client0, t0 = sum(proc.cpu_times()[:2]), time.process_time(), time.time()
        asyncio.run(drive(port, workflows, concurrency))
        wall = time.time() - t0
        server_cpu = sum(proc.cpu_times()[:2]) - server0
        client_cpu = time.process_time() - client0
    finally:
        server.kill()
        server.join()
    return {
        "events_per_workflow": events,
        "workflows": workflows,
        "concurrency": concurrency,
        "workflows_per_s": round(workflows / wall, 1),
        "server_cpu_ms_per_workflow": round(server_cpu / workflows * 1000, 3),
        "client_cpu_ms_per_workflow": round(client_cpu / workflows * 1000, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=20)
    args = parser.parse_args()
    for events in (EVERY_EVENT, OUTCOME_ONLY):
        r = measure(events, args.workflows, args.concurrency)
        print(
            f"StartWorkflow + WatchWorkflow of {events} events, {args.workflows} workflows at"
            f" concurrency {args.concurrency}: server {r['server_cpu_ms_per_workflow']} ms,"
            f" client {r['client_cpu_ms_per_workflow']} ms of CPU per workflow,"
            f" {r['workflows_per_s']} workflows/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
