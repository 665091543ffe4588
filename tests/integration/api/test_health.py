"""`grpc.health.v1.Health`: Check, and List over every service the server registers."""

from __future__ import annotations

from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.conftest import RunningEngine
from workflow_engine.app import SERVICE_NAME

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def test_list_answers_the_status_of_every_registered_service(
    running: RunningEngine,
) -> None:
    health = health_pb2_grpc.HealthStub(running.channel)
    answer = await health.List(health_pb2.HealthListRequest(), timeout=5)
    statuses = {name: response.status for name, response in answer.statuses.items()}
    assert statuses == {"": SERVING, SERVICE_NAME: SERVING}


async def test_list_follows_status_changes(running: RunningEngine) -> None:
    # Not a copy taken at start-up: List reads the statuses that Check and Watch answer from.
    health = health_pb2_grpc.HealthStub(running.channel)
    await running.server.health.set(SERVICE_NAME, NOT_SERVING)
    answer = await health.List(health_pb2.HealthListRequest(), timeout=5)
    assert answer.statuses[SERVICE_NAME].status == NOT_SERVING
    assert answer.statuses[""].status == SERVING
    checked = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
    assert checked.status == NOT_SERVING
