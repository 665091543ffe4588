"""`workflow-engine worker-node`: the node's process, served by uvicorn on the node's own socket.

The socket is bound before uvicorn starts, so port 0 works and the `serving` log line names the
real address. With a certificate and key (``WORKFLOW_ENGINE_NODE_TLS_CERT_FILE`` / ``_KEY_FILE``)
the port speaks HTTPS only (TLS 1.2 or later); without, it serves plaintext, which the command
refuses on an address beyond loopback unless ``WORKFLOW_ENGINE_NODE_ALLOW_PLAINTEXT_REMOTE``
says so (`NodeSettings.check_exposure`), and then logs ``node_serving_plaintext_remote``.

The data directory is locked (``node.lock``, `flock`) for the process's life: a second node
on the same directory would break the one-run-per-job_id promise, so it is refused.

SIGTERM (or SIGINT) drains: /readyz turns 503 and new job ids are refused (503) at once; the
jobs this process runs may finish for `drain_seconds`, then the server stops. A job still
running then is not killed: it outlives the node, as a job outlives the engine, and a node
restarted on the same data directory answers its job_id with it. A second signal stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog
import uvicorn

from workflow_engine import _pid_file as pid_file
from workflow_engine.capabilities.workers import LocalSandboxWorker
from workflow_engine.config import ENV_PREFIX, NodeSettings
from workflow_engine.errors import ConfigError, NodeInUse
from workflow_engine.sandbox import Confinement, require_jobwrap
from workflow_engine.worker_node._connections import bounded_h11
from workflow_engine.worker_node._job_runs import NodeJobs
from workflow_engine.worker_node._routes import create_app

log = structlog.get_logger(__name__)

LOCK_FILE = "node.lock"
#: How long uvicorn waits, after the drain, for requests still open (jobs that outlive it).
_CLOSE_SECONDS = 1


class _NodeServer(uvicorn.Server):
    """uvicorn with the node's drain on SIGTERM instead of its immediate shutdown."""

    def __init__(self, config: uvicorn.Config, jobs: NodeJobs, settings: NodeSettings) -> None:
        super().__init__(config)
        self._jobs = jobs
        self._settings = settings
        self._address = ""
        self._drain: asyncio.Task[None] | None = None

    async def serve_on(self, sock: socket.socket) -> None:
        host, port = sock.getsockname()[:2]
        self._address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        await self.serve(sockets=[sock])

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn sets no TLS handshake timeout (asyncio's default is 60 s), and a connection
        # meets the node's bounds (`worker_node._connections`) only once its handshake is done: its
        # handshake gets the head's time. uvicorn makes its servers with the loop's
        # `create_server`, which is given it here for the call.
        loop = asyncio.get_running_loop()
        made = loop.create_server
        handshake = self._settings.head_timeout_seconds

        async def create_server(*args: Any, **kwargs: Any) -> asyncio.Server:
            if kwargs.get("ssl") is not None:
                kwargs["ssl_handshake_timeout"] = handshake
            return await made(*args, **kwargs)

        loop.create_server = create_server  # type: ignore[method-assign]
        try:
            await super().startup(sockets)
        finally:
            del loop.create_server
        tls = bool(self._settings.tls_cert_file)
        log.info(
            "serving",
            address=self._address,
            url=f"{'https' if tls else 'http'}://{self._address}",
            tls=tls,
            data_dir=str(self._settings.data_dir),
            max_timeout_seconds=self._settings.max_timeout_seconds,
            pid=os.getpid(),
        )
        if self._settings.plaintext_remote:  # allowed: `check_exposure` refuses it otherwise
            log.warning(
                "node_serving_plaintext_remote",
                address=self._address,
                allowed_by=f"{ENV_PREFIX}NODE_ALLOW_PLAINTEXT_REMOTE",
                risk="the bearer token and every job cross the network in clear",
            )

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # Replaces uvicorn's handlers, which stop at once and re-raise the signal at exit.
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            yield
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: int) -> None:
        if self._drain is None:
            self._drain = asyncio.create_task(self._drain_then_stop(sig))
        else:  # a second signal: stop now
            self.should_exit = True
            self.force_exit = True

    async def _drain_then_stop(self, sig: int) -> None:
        self._jobs.draining = True
        log.info(
            "node_draining",
            signal=signal.Signals(sig).name,
            running_jobs=self._jobs.running,
            drain_seconds=self._settings.drain_seconds,
        )
        idle = await self._jobs.wait_idle(self._settings.drain_seconds)
        log.info("node_drained", idle=idle, still_running=self._jobs.running)
        self.should_exit = True


def bind(listen: str) -> socket.socket:
    """A listening TCP socket on `listen` (``host:port``, ``[v6]:port``; port 0 picks one)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--listen: expected HOST:PORT, got {listen!r}")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 (":8090" means every interface, as asked)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY only on sockets that say so, and
    # without it every answer waits ~40 ms for the client's delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    return sock


def node_tls_context(settings: NodeSettings) -> ssl.SSLContext | None:
    """The node port's TLS context, from its certificate and key; None: plaintext. Raises
    `ConfigError` naming the settings when they cannot be used."""
    if not settings.tls_cert_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])  # what uvicorn's h11 speaks
    try:
        context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"{ENV_PREFIX}NODE_TLS_CERT_FILE={settings.tls_cert_file} and "
            f"{ENV_PREFIX}NODE_TLS_KEY_FILE={settings.tls_key_file}: cannot load them as a "
            f"certificate chain and its key ({exc})"
        ) from None
    return context


@contextlib.contextmanager
def lock_data_dir(data_dir: Path) -> Iterator[None]:
    """Hold the data directory for this process; `NodeInUse` if another node holds it."""

    def in_use(holder: str) -> None:
        raise NodeInUse(f"--data-dir: {data_dir} is in use by another worker node (pid {holder})")

    with pid_file.held(data_dir / LOCK_FILE, in_use):
        yield


async def serve_node(settings: NodeSettings) -> None:
    """Serve the Worker API until SIGTERM has drained the node (see the module docstring)."""
    settings.check_exposure()
    require_jobwrap()  # the node runs its jobs through it: without it, it refuses to start
    tls = node_tls_context(settings)
    with lock_data_dir(settings.data_dir), bind(settings.listen) as sock:
        runner = LocalSandboxWorker(
            jobs_dir=settings.data_dir / "jobs",
            default_timeout_seconds=settings.default_timeout_seconds,
            max_output_bytes=settings.output_bytes,
            confinement=Confinement(
                settings.limits,
                uid_base=settings.job_uid_base,
                uid_count=settings.job_uid_count,
                writable_paths=settings.job_writable(),
            ),
            retention_seconds=settings.job_retention_seconds,
        )
        jobs = NodeJobs(runner)
        config = uvicorn.Config(
            create_app(settings, jobs),
            lifespan="off",
            # A bounded number of connections, each request's head timed.
            http=bounded_h11(settings.max_connections, settings.head_timeout_seconds),
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=_CLOSE_SECONDS,
            # A synchronous job can take hours: the client's keep-alive is its own business.
            timeout_keep_alive=75,
            ssl_context_factory=None if tls is None else lambda config, default: tls,
        )
        async with runner:  # prunes expired job directories while it serves
            await _NodeServer(config, jobs, settings).serve_on(sock)
    log.info("node_stopped")
