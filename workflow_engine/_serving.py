"""`workflow-engine serve` in one process: the engine behind a `grpc.aio` server, until a signal.

`GrpcServer` puts an open `Engine` behind the WorkflowEngine service, with health checking,
reflection, TLS and the callers' authentication as the settings ask. Signals are handled from
the start, so a SIGTERM during start-up stops the process at once and
one after it drains the runs; under a supervisor, the process also dies with its parent and
reports when it serves. Metrics and tracing are switched on here, for the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar, cast

import grpc
import structlog
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from workflow_engine import _secret_files as secret_files
from workflow_engine import _under_supervisor as under_supervisor
from workflow_engine._masking import EngineSecrets
from workflow_engine.api import (
    Authenticator,
    AuthInterceptor,
    Callers,
    CommentedPool,
    HealthServicer,
    RequestReader,
    TelemetryInterceptor,
    WorkflowEngineServicer,
    generic_handler,
)
from workflow_engine.config import Settings
from workflow_engine.engine import Engine
from workflow_engine.errors import AddressInUse, AuthConfigError
from workflow_engine.runtime import Readiness
from workflow_engine.telemetry import Metrics, serve_metrics, tracing
from workflow_engine.v1 import workflow_engine_pb2 as pb

log = structlog.get_logger(__name__)
T = TypeVar("T")

SERVICE = pb.DESCRIPTOR.services_by_name["WorkflowEngine"]
SERVICE_NAME = SERVICE.full_name


class GrpcServer:
    """The engine behind a `grpc.aio` server with health checking and reflection."""

    def __init__(self, engine: Engine, *, reuse_port: bool = False) -> None:
        self.engine = engine
        settings = engine.settings
        settings.check_exposure()
        limit = settings.max_message_bytes
        authenticator = auth_of(settings, engine.context.secrets)
        # Only the engines of one supervisor share their ports (see `supervisor`).
        shared = [("grpc.so_reuseport", int(reuse_port))]
        interceptors: list[grpc.aio.ServerInterceptor] = []  # type: ignore[type-arg]
        metrics = engine.context.metrics
        if metrics.enabled or tracing.enabled():  # outermost: it sees refused calls too
            interceptors.append(TelemetryInterceptor(SERVICE_NAME, metrics))
        self.reader = reader = RequestReader()
        if authenticator:
            interceptors.append(AuthInterceptor(authenticator, SERVICE_NAME, reader.read))
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                *shared,
            ],
            interceptors=interceptors,
        )
        self.server.add_generic_rpc_handlers(
            (
                generic_handler(
                    SERVICE,
                    WorkflowEngineServicer(
                        engine.service, reader, engine.context.secrets, engine.schedules
                    ),
                ),
            )
        )
        self.health = HealthServicer()
        self.readiness: Readiness | None = None
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        # Plaintext health only, for probes that cannot speak TLS (Kubernetes' gRPC probes).
        self.health_server: grpc.aio.Server | None = None
        self.health_port = 0
        if settings.health_listen:
            self.health_server = health_server = grpc.aio.server(options=shared)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, health_server)
            self.health_port = _bound(
                "WORKFLOW_ENGINE_HEALTH_LISTEN",
                settings.health_listen,
                partial(health_server.add_insecure_port, settings.health_listen),
            )
        if settings.reflection:
            reflection.enable_server_reflection(
                (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME),
                self.server,
                # grpcurl describe shows the contract's comments; it quacks as a DescriptorPool.
                pool=cast(DescriptorPool, CommentedPool()),
            )
        credentials = server_credentials(settings)
        if credentials is None:
            add = partial(self.server.add_insecure_port, settings.listen)
        else:
            add = partial(self.server.add_secure_port, settings.listen, credentials)
        self.port = _bound("WORKFLOW_ENGINE_LISTEN", settings.listen, add)

    @property
    def address(self) -> str:
        host = self.engine.settings.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    async def start(self) -> None:
        await self.server.start()
        if self.health_server is not None:
            await self.health_server.start()
        await self._set_health(True)
        settings = self.engine.settings
        # Readiness moves the service's status only: the server's own ("") says the process
        # is alive, which is what a liveness probe asks (a database outage is no reason to
        # restart the engine).
        self.readiness = Readiness(
            pool=self.engine.pool,
            data_dir=settings.data_dir,
            interval_seconds=settings.readiness_interval_seconds,
            on_change=lambda ready, _why: self._set_health(ready, names=(SERVICE_NAME,)),
        )
        self.readiness.start()
        # Under a supervisor, the supervisor says "serving" once every engine does.
        event = "engine_process_serving" if under_supervisor.supervised() else "serving"
        log.info(event, address=self.address, holder_id=self.engine.settings.holder_id)

    async def _set_health(self, serving: bool, names: tuple[str, ...] = ("", SERVICE_NAME)) -> None:
        answer = health_pb2.HealthCheckResponse
        status = answer.SERVING if serving else answer.NOT_SERVING
        for name in names:
            await self.health.set(name, status)

    async def stop(self, *, drain_timeout: float | None = None) -> None:
        """Graceful stop: NOT_SERVING first, then drain the runs, then close the listener."""
        if self.readiness is not None:
            await self.readiness.close()
        await self._set_health(False)
        await self.engine.close(drain_timeout=drain_timeout)
        await self.server.stop(grace=5)
        self.reader.close()
        if self.health_server is not None:
            await self.health_server.stop(grace=1)
        log.info("stopped")


def _bound(setting: str, address: str, add_port: Callable[[], int]) -> int:
    """The port `add_port` bound `address` to; `AddressInUse`, naming `setting`, when it could
    not (gRPC says so by raising, or, in older releases, by answering 0)."""
    try:
        port = add_port()
    except RuntimeError:
        port = 0
    if port == 0:
        raise AddressInUse(f"{setting}: cannot listen on {address} (in use, or not this host's)")
    return port


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials from the settings' PEM files (None: plaintext)."""
    if not settings.tls_cert_file:
        return None
    files = {
        "TLS_CERT_FILE": settings.tls_cert_file,
        "TLS_KEY_FILE": settings.tls_key_file,
        "TLS_CLIENT_CA_FILE": settings.tls_client_ca_file,
    }
    pem: dict[str, bytes | None] = {}
    for name, path in files.items():
        where = f"WORKFLOW_ENGINE_{name} ({path})"
        if not path:
            pem[name] = None
            continue
        try:
            pem[name], mode = secret_files.read(path)
        except OSError as exc:
            raise AuthConfigError(f"{where}: {exc.strerror}") from None
        # The key is the engine's alone; no one else may swap the certificate or client CA.
        holds = "the server's private key" if name == "TLS_KEY_FILE" else None
        problem = secret_files.exposed(where, path, mode, holds=holds)
        if problem:
            raise AuthConfigError(problem)
    chain, key, client_ca = (pem[name] for name in files)
    return grpc.ssl_server_credentials(
        [(key or b"", chain or b"")],  # Settings checks both are given
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def auth_of(settings: Settings, secrets: EngineSecrets | None = None) -> Authenticator | None:
    """Who may call, from the settings (None: everyone who reaches the port); the callers'
    plaintext tokens become credentials of `secrets` (the serving engine's)."""
    if not settings.authenticates:
        return None
    callers = Callers.load(settings.tokens_file, secrets) if settings.tokens_file else None
    return Authenticator(callers, client_certificates=bool(settings.tls_client_ca_file))


async def unless_stopped(stop: asyncio.Event, starting: Awaitable[T]) -> T | None:
    """What `starting` returns, or None if `stop` is set first: the start-up is then cancelled
    (it cleans up after itself), so a SIGTERM while, say, the database is still unreachable
    stops the process at once instead of being ignored until a timeout."""
    work = asyncio.ensure_future(starting)
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if work.done():
        return work.result()
    work.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await work
    return None


async def serve(settings: Settings) -> None:
    """Run until SIGTERM or SIGINT, then drain and exit."""
    # Handled from the start: a signal during start-up (or just after the "serving" line) is a
    # graceful stop once serving, not the default death that would skip every clean-up.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if under_supervisor.supervised():
        under_supervisor.die_with_parent()
    tracing.enable_tracing()
    metrics_server = None
    try:
        engine = await unless_stopped(stop, Engine(settings).open())
        if engine is None:
            log.info("stopped", during="start-up")
            return
        try:
            metrics_server = start_metrics(settings, engine.context.metrics)
            server = GrpcServer(engine, reuse_port=under_supervisor.supervised())
            await server.start()
        except BaseException:
            await engine.close(drain_timeout=0)
            raise
        if under_supervisor.supervised():
            under_supervisor.report_serving()
        await stop.wait()
        log.info("shutdown_requested")
        await server.stop()
    finally:
        tracing.shutdown_tracing()
        if metrics_server is not None:
            metrics_server.shutdown()


def start_metrics(settings: Settings, metrics: Metrics) -> Any:
    """Turn the engine's `metrics` on when `metrics_listen` is set, and serve them (its
    server, or None).

    An engine under a supervisor only records them (into the supervisor's multiprocess
    directory): the supervisor serves every process's sum on the one address.
    """
    if not settings.metrics_listen:
        return None
    registry = metrics.enable()
    if under_supervisor.supervised():
        return None
    server, port = serve_metrics(settings.metrics_listen, registry)
    host = settings.metrics_listen.rpartition(":")[0]
    log.info("metrics_serving", address=f"{host}:{port}", path="/metrics")
    return server
