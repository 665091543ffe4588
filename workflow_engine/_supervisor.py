"""`workflow-engine serve` on every core: one supervisor, N engine processes on one port.

One Python process runs Python on one core at a time, so one engine process leaves the other
cores idle. With `processes` above 1, `serve` becomes this supervisor: it prepares what the
engines share (the embedded PostgreSQL when no URL is given, the schema), reserves the address,
and starts N complete engine processes (`workflow-engine serve` with `processes=1`), each with
its own pool, runs and recovery. They hold leases under the one configured holder id (what the
orchestrator sees), each lease naming the process that took it (`holder/slot`, a name a
restarted process keeps). They all listen on the same address with `SO_REUSEPORT`, so the
kernel spreads incoming connections across them. A client's channel
is one connection: a `StartWorkflow` and the `WatchWorkflow` after it on the same channel reach
the same process, which serves the watch from its own writes.

A process that dies is started again (with a growing pause if it keeps dying); its workflows'
leases expire and recovery, in any process, adopts them. SIGTERM or SIGINT is passed on to
every process, each drains as a single engine does, and the supervisor exits once they all
have. The engines ask the kernel to send them SIGTERM when the supervisor dies, so a killed
supervisor leaves none behind.

The supervisor reserves the port by binding (not listening on) a socket with `SO_REUSEPORT`
before any engine starts, so a port of 0 becomes one free port that every engine then binds,
and nothing else can take it while an engine restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import structlog
from prometheus_client import multiprocess

from workflow_engine._serving import unless_stopped
from workflow_engine._under_supervisor import PARENT_ENV, READY_FD_ENV
from workflow_engine.capabilities import check_choices
from workflow_engine.config import Settings
from workflow_engine.errors import AddressInUse
from workflow_engine.storage import database_url, migrate_database
from workflow_engine.telemetry import MULTIPROC_ENV, serve_metrics, summed_registry

log = structlog.get_logger(__name__)

#: How long an engine may take to serve before the supervisor gives up on starting.
START_TIMEOUT_SECONDS = 120.0
#: Pause before restarting an engine that died; doubles up to the maximum while it keeps dying.
RESTART_PAUSE_SECONDS = 1.0
MAX_RESTART_PAUSE_SECONDS = 30.0
#: An engine that served this long before dying is restarted after the shortest pause again.
STABLE_SECONDS = 60.0


def reserve(listen: str) -> tuple[socket.socket, str]:
    """Bind `listen` with SO_REUSEPORT (not listening); the socket and the real host:port.

    The address is first bound without SO_REUSEPORT, which fails while anything holds it, so a
    second supervisor (or engine) started on the same port is refused instead of sharing it.
    That bind has SO_REUSEADDR, as every server's has: the connections of an engine that just
    stopped, left in TIME_WAIT on the port, do not hold it.
    """
    host, _, port = listen.rpartition(":")
    bare = host.strip("[]")
    family, kind, proto, _, address = socket.getaddrinfo(
        bare or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            why = f"cannot listen on {listen}: {exc.strerror}"
            raise AddressInUse(f"WORKFLOW_ENGINE_LISTEN: {why}") from None
        address = probe.getsockname()  # a port of 0: the one the kernel chose
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock, f"{host}:{sock.getsockname()[1]}"


@dataclass
class _Engine:
    number: int
    process: asyncio.subprocess.Process


class Supervisor:
    """Starts, restarts and stops the engine processes (see the module docstring)."""

    def __init__(
        self, settings: Settings, database_url: str, address: str, metrics_dir: str = ""
    ) -> None:
        self._settings = settings
        self._database_url = database_url
        self._address = address
        # Where the engines record their metrics for the supervisor to sum ("": metrics off).
        self._metrics_dir = metrics_dir
        self._started = 0  # engines started so far
        self._engines: dict[int, _Engine] = {}  # by slot
        self._stopping = False

    async def start_all(self) -> list[int]:
        """Start every engine and wait until each serves; their pids."""
        slots = range(1, self._settings.processes + 1)
        engines = await asyncio.gather(*(self._start(slot) for slot in slots))
        return [e.process.pid for e in engines]

    async def _start(self, slot: int) -> _Engine:
        self._started += 1
        read_fd, write_fd = os.pipe()
        settings = self._settings
        env = {
            **os.environ,
            # What the command line may have set, besides what differs per engine.
            "WORKFLOW_ENGINE_DATA_DIR": str(settings.data_dir),
            "WORKFLOW_ENGINE_LEASE_TTL_SECONDS": str(settings.lease_ttl_seconds),
            "WORKFLOW_ENGINE_LOG_LEVEL": settings.log_level,
            "WORKFLOW_ENGINE_PROCESSES": "1",
            "WORKFLOW_ENGINE_DATABASE_URL": self._database_url,
            "WORKFLOW_ENGINE_LISTEN": self._address,
            # One holder id for the whole engine, as the orchestrator configured it; each
            # process's name (kept by its restarts) tells whose lease is whose.
            "WORKFLOW_ENGINE_HOLDER_ID": settings.holder_id,
            "WORKFLOW_ENGINE_PROCESS_NAME": f"{settings.holder_id}/{slot}",
            READY_FD_ENV: str(write_fd),
            PARENT_ENV: str(os.getpid()),
        }
        if self._metrics_dir:
            env[MULTIPROC_ENV] = self._metrics_dir
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "workflow_engine.cli", "serve", env=env, pass_fds=(write_fd,)
            )
        finally:
            os.close(write_fd)
        engine = self._engines[slot] = _Engine(self._started, process)
        try:
            async with asyncio.timeout(START_TIMEOUT_SECONDS):
                ready = await _read_line(read_fd)
        finally:
            os.close(read_fd)
        if not ready:
            code = await process.wait()
            raise RuntimeError(f"engine process {slot} exited with {code} before serving")
        return engine

    async def watch(self) -> None:
        """Restart any engine that dies, until `stop`."""
        await asyncio.gather(*(self._keep(slot) for slot in list(self._engines)))

    async def _keep(self, slot: int) -> None:
        pause = RESTART_PAUSE_SECONDS
        while True:
            engine = self._engines[slot]
            started = asyncio.get_running_loop().time()
            code = await engine.process.wait()
            if self._metrics_dir:  # its gauges (jobs in flight) no longer count
                multiprocess.mark_process_dead(engine.process.pid, self._metrics_dir)  # type: ignore[no-untyped-call]
            if self._stopping:
                return
            if asyncio.get_running_loop().time() - started > STABLE_SECONDS:
                pause = RESTART_PAUSE_SECONDS
            log.warning(
                "engine_process_exited",
                slot=slot,
                pid=engine.process.pid,
                code=code,
                restart_in=pause,
            )
            await asyncio.sleep(pause)
            pause = min(pause * 2, MAX_RESTART_PAUSE_SECONDS)
            if self._stopping:
                return
            try:
                restarted = await self._start(slot)
            except (RuntimeError, TimeoutError, OSError) as exc:
                log.error("engine_process_restart_failed", slot=slot, error=repr(exc))
                continue
            log.info("engine_process_restarted", slot=slot, pid=restarted.process.pid)

    async def stop(self) -> None:
        """SIGTERM to every engine; wait until each has drained and exited."""
        self._stopping = True
        for engine in self._engines.values():
            with contextlib.suppress(ProcessLookupError):
                engine.process.send_signal(signal.SIGTERM)
        await asyncio.gather(*(e.process.wait() for e in self._engines.values()))


async def _read_line(fd: int) -> bytes:
    """The first line written on `fd` (empty once the writer closed it without one)."""
    return await asyncio.to_thread(_blocking_read_line, fd)


def _blocking_read_line(fd: int) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 64)
        if not chunk:
            break
        data += chunk
    return data


async def supervise(settings: Settings) -> None:
    """Serve with `settings.processes` engine processes until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    check_choices(settings)  # a bad setting is refused before anything starts
    async with database_url(settings) as url:
        applied = await unless_stopped(stop, migrate_database(url, settings))
        if applied is None:
            log.info("stopped", during="start-up")
            return
        log.info("schema_ready", migrations=applied)
        reservation, address = reserve(settings.listen)
        with reservation, _summed_metrics(settings) as metrics_dir:
            supervisor = Supervisor(settings, url, address, metrics_dir)
            try:
                await _serve_until(stop, supervisor, address)
            finally:
                await supervisor.stop()
            log.info("stopped")


@contextlib.contextmanager
def _summed_metrics(settings: Settings) -> Iterator[str]:
    """With metrics on: a directory the engines record into, and the sum of it served on
    `metrics_listen` (see `telemetry._metrics`); the directory, or "" with metrics off."""
    if not settings.metrics_listen:
        yield ""
        return
    directory = tempfile.mkdtemp(prefix="workflow-engine-metrics-")
    server, port = serve_metrics(settings.metrics_listen, summed_registry(directory))
    host = settings.metrics_listen.rpartition(":")[0]
    log.info("metrics_serving", address=f"{host}:{port}", path="/metrics", processes="summed")
    try:
        yield directory
    finally:
        server.shutdown()
        shutil.rmtree(directory, ignore_errors=True)


async def _serve_until(stop: asyncio.Event, supervisor: Supervisor, address: str) -> None:
    starting = asyncio.create_task(supervisor.start_all())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # a signal during start-up
        starting.cancel()
        return
    stopped.cancel()
    pids = starting.result()  # an engine that could not start ends it here
    log.info("serving", address=address, processes=len(pids), pids=pids)
    keeping = asyncio.create_task(supervisor.watch())
    await stop.wait()
    keeping.cancel()
