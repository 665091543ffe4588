"""`grpc.health.v1.Health`: Check, and List over every service the server registers."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc
from psycopg.conninfo import conninfo_to_dict

from tests.conftest import RunningEngine, start_engine, stop_engine
from workflow_engine._serving import SERVICE_NAME
from workflow_engine.config import Settings

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


async def test_health_is_not_serving_while_the_data_dir_or_the_database_is_unusable(
    settings: Settings, pg_server_url: str, template_db: str, db_url: str
) -> None:
    running = await start_engine(replace(settings, readiness_interval_seconds=0.2))
    health = health_pb2_grpc.HealthStub(running.channel)

    async def becomes(status: int) -> None:
        request = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        deadline = asyncio.get_running_loop().time() + 30
        while (await health.Check(request, timeout=5)).status != status:
            assert asyncio.get_running_loop().time() < deadline, f"still not {status}"
            await asyncio.sleep(0.1)
        # The server's own status ("", what a liveness probe asks) says the process lives.
        assert (await health.Check(health_pb2.HealthCheckRequest(), timeout=5)).status == SERVING

    try:
        await becomes(SERVING)
        # The data directory cannot take a file: a file stands where it should be.
        data = settings.data_dir
        data.mkdir(parents=True, exist_ok=True)
        aside = data.with_name("data-aside")
        data.rename(aside)
        data.write_text("not a directory")
        await becomes(NOT_SERVING)
        data.unlink()
        aside.rename(data)
        await becomes(SERVING)
        # The database is gone, then back.
        name = conninfo_to_dict(db_url)["dbname"]
        async with await psycopg.AsyncConnection.connect(pg_server_url, autocommit=True) as admin:
            await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
            await becomes(NOT_SERVING)
            await admin.execute(f"CREATE DATABASE {name} TEMPLATE {template_db}")
        await becomes(SERVING)
    finally:
        await stop_engine(running)
