"""The engine's Prometheus metrics: what operators graph and alert on.

Each engine owns one `Metrics` (`workflow_engine._context`) and hands it to what reports: off
unless its settings ask for them (``WORKFLOW_ENGINE_METRICS_LISTEN``; the engine calls `enable`
as it starts, `serve` serves them), and while off every call is a no-op on a stand-in, so the
hot path pays nothing measurable. An enabled `Metrics` has a registry of its own (nothing is
registered in prometheus_client's default one), so two engines in one process count apart.
Each metric is a typed field of `_Instruments`, defined there once with its name, help text and
labels: a method that names one misspelt, or uses a counter as a gauge, is a type error.
Names follow the OpenTelemetry semantic conventions where they define the thing
(``rpc.server.call.duration``, ``gen_ai.client.token.usage``,
``gen_ai.client.operation.duration``, ``gen_ai.workflow.duration``), as Prometheus spells them
(dots to underscores, the unit as a suffix); the engine's own are ``workflow_engine_*``,
counters ending in ``_total``.

With several engine processes (`supervisor`), each writes its values to files in
``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multiprocess mode, set up by the
supervisor before the processes start) and the supervisor serves their sum; each of those
processes runs one engine.
"""

from __future__ import annotations

import platform
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, cast

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    multiprocess,
)
from prometheus_client.exposition import start_http_server

from workflow_engine._clock import Clock, SystemClock
from workflow_engine.version import __version__

#: Seconds: node and job durations reach from milliseconds to hours.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
#: Seconds: a checkpoint write or an RPC is milliseconds, a watch may be minutes.
FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 30)
#: Tokens per model call (the GenAI conventions' buckets, cut to what a plan or verdict takes).
TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144)
#: Rows per group commit.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class _Counter(Protocol):
    """What the engine calls on a counter: prometheus_client's `Counter`, or `_Off`."""

    def labels(self, *values: str, **labels: str) -> _Counter: ...

    def inc(self, amount: float = 1) -> None: ...


class _Gauge(Protocol):
    """What the engine calls on a gauge: prometheus_client's `Gauge`, or `_Off`."""

    def labels(self, *values: str, **labels: str) -> _Gauge: ...

    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...

    def set(self, value: float) -> None: ...


class _Histogram(Protocol):
    """What the engine calls on a histogram: prometheus_client's `Histogram`, or `_Off`."""

    def labels(self, *values: str, **labels: str) -> _Histogram: ...

    def observe(self, amount: float) -> None: ...


class _Off:
    """What every metric is while metrics are off: takes any call, does nothing."""

    def labels(self, *values: str, **labels: str) -> _Off:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def dec(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass

    def set(self, value: float) -> None:
        pass


_OFF = _Off()
# The stand-in is each kind of metric (mypy checks it here, where it is said).
_OFF_KINDS: tuple[_Counter, _Gauge, _Histogram] = (_OFF, _OFF, _OFF)


class Metrics:
    """The metrics, and one method per thing the engine reports (see the module docstring)."""

    def __init__(self, clock: Clock | None = None) -> None:
        #: What a workflow's duration and the last retention round are read from: the
        #: engine's clock (its `EngineContext` sets it).
        self.clock: Clock = SystemClock() if clock is None else clock
        self.enabled = False
        self.registry: CollectorRegistry | None = None
        self._m: _Instruments = _Instruments()  # every one the stand-in

    def enable(self) -> CollectorRegistry:
        """Create the metrics (once); the registry that serves them in this process."""
        if self.registry is None:
            disable_created_metrics()  # type: ignore[no-untyped-call]  # no `*_created` series
            self.registry = CollectorRegistry(auto_describe=True)
            self._m = _Instruments.made_in(self.registry)
            self.enabled = True
            self._m.build_info.labels(**build_info()).set(1)
        return self.registry

    # -- what the engine reports ------------------------------------------------------------

    def rpc(self, method: str, code: int, seconds: float) -> None:
        self._m.rpc_duration.labels(
            rpc_system="grpc",
            rpc_service="workflow_engine.v1.WorkflowEngine",
            rpc_method=method,
            rpc_grpc_status_code=str(code),
        ).observe(seconds)

    def workflow_started(self) -> None:
        self._m.workflows_started.inc()

    def workflow_finished(self, status: str, started_at: Any) -> None:
        """`started_at`: the state's epoch seconds of the first start (if it has one)."""
        self._m.workflows_finished.labels(status=status).inc()
        if isinstance(started_at, int | float) and started_at > 0:
            self._m.workflow_duration.labels(status=status).observe(self.clock.now() - started_at)

    def node_completed(self, node: str, seconds: float) -> None:
        self._m.node_duration.labels(node=node).observe(seconds)

    def checkpoints_committed(self, rows: int, seconds: float) -> None:
        self._m.checkpoint_batch.observe(rows)
        self._m.checkpoint_write.observe(seconds)

    def lease(self, event: str) -> None:
        """`event`: acquired, renewed, lost or released."""
        self._m.lease_events.labels(event=event).inc()

    def recovery_adopted(self) -> None:
        self._m.recovery_adoptions.inc()

    def schedule_fired(self, outcome: str) -> None:
        """A schedule's due slot was handled: `outcome` started, taken (another replica
        started it), skipped (overlap), missed (catch-up) or failed (the template would not
        start)."""
        self._m.schedule_fires.labels(outcome=outcome).inc()

    def approval_expired(self, action: str) -> None:
        """The timer sweep applied an approval request's expiry: `action` reject or suspend."""
        self._m.approvals_expired.labels(action=action).inc()

    def unreadable_workflows(self, count: int) -> None:
        """Unfinished workflows in a state format this engine does not read (see
        `domain.state_format`), as the recovery sweep last counted them."""
        self._m.unreadable_workflows.set(count)

    def retention_pruned(self, workflows: int, rows: dict[str, int]) -> None:
        """A retention batch pruned `workflows`, deleting `rows` rows by table."""
        self._m.retention_workflows.inc(workflows)
        for table, count in rows.items():
            if count:
                self._m.retention_rows.labels(table=table).inc(count)

    def retention_round_done(self) -> None:
        """A retention round left nothing due (now)."""
        self._m.retention_last_round.set(self.clock.now())

    def held(self, census: Iterable[tuple[str, int, int]]) -> None:
        """What the engine holds now, as (structure, entries, bound) (`runtime._census`; a
        bound of 0: its entries end with their workflows)."""
        gauge = self._m.held_entries
        for structure, entries, bound in census:
            gauge.labels(structure=structure, bound=str(bound)).set(entries)

    def job_started(self, worker: str) -> None:
        self._m.jobs_in_flight.labels(worker=worker).inc()

    def job_ended(self, worker: str, status: str, seconds: float) -> None:
        self._m.jobs_in_flight.labels(worker=worker).dec()
        self._m.job_duration.labels(worker=worker, status=status).observe(seconds)

    def model_call(
        self,
        *,
        purpose: str,
        model: str,
        seconds: float,
        input_tokens: int,
        output_tokens: int,
        error: str = "",
    ) -> None:
        labels = {
            "gen_ai_operation_name": "chat",
            "gen_ai_request_model": model,
            "workflow_engine_purpose": purpose,
        }
        self._m.model_duration.labels(**labels, error_type=error).observe(seconds)
        if not error:
            for kind, tokens in (("input", input_tokens), ("output", output_tokens)):
                self._m.model_tokens.labels(**labels, gen_ai_token_type=kind).observe(tokens)


#: The local job wrapper as the package builds it (`sandbox._wrapper.JOBWRAP`; named here so
#: that telemetry imports no layer of the engine).
JOBWRAP = Path(__file__).parents[1] / "sandbox" / "jobwrap"
_PT_INTERP = 3  # an ELF program header naming the dynamic loader


def build_info() -> dict[str, str]:
    """The labels of ``workflow_engine_build_info``: which engine this is (its version, the
    Python running it) and how its job wrapper was built (`jobwrap_linkage`)."""
    return {
        "version": __version__,
        "python": platform.python_version(),
        "jobwrap": jobwrap_linkage(JOBWRAP),
    }


def jobwrap_linkage(path: Path) -> str:
    """static, dynamic (it names a loader: ld.so must be there for every job), absent (not
    built: the local sandbox refuses to start, so only an engine whose jobs run elsewhere
    serves), or unknown (not a 64-bit ELF)."""
    try:
        with path.open("rb") as file:
            header = file.read(64)
            if header[:5] != b"\x7fELF\x02" or len(header) < 64:
                return "unknown"
            order = "<" if header[5] == 1 else ">"
            (phoff,) = struct.unpack_from(order + "Q", header, 32)
            size, count = struct.unpack_from(order + "HH", header, 54)
            file.seek(phoff)
            table = file.read(size * count)
    except OSError:
        return "absent"
    types = (struct.unpack_from(order + "I", table, i * size)[0] for i in range(count))
    return "dynamic" if _PT_INTERP in types else "static"


_M = TypeVar("_M")
#: How several engine processes' values of a gauge make one (prometheus_client's modes).
_Summed = Literal["max", "livemax", "livesum"]


def _metric(make: Callable[[CollectorRegistry], _M]) -> _M:
    """A field of `_Instruments`: the stand-in, until `_Instruments.made_in` calls `make`."""
    return cast(_M, field(default=_OFF, metadata={"make": make}))


def _histogram(
    name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]
) -> _Histogram:
    return _metric(
        lambda registry: Histogram(name, doc, labels, registry=registry, buckets=buckets)
    )


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> _Counter:
    return _metric(lambda registry: Counter(name, doc, labels, registry=registry))


def _gauge(name: str, doc: str, labels: tuple[str, ...] = (), *, summed: _Summed) -> _Gauge:
    return _metric(
        lambda registry: Gauge(name, doc, labels, registry=registry, multiprocess_mode=summed)
    )


_MODEL_LABELS = ("gen_ai_operation_name", "gen_ai_request_model", "workflow_engine_purpose")


@dataclass(frozen=True, slots=True)
class _Instruments:
    """Every metric, as the field its `Metrics` method reports on (a name misspelt there is a
    type error); each the stand-in until `made_in` makes them in a registry, in this order."""

    rpc_duration: _Histogram = _histogram(
        "rpc_server_call_duration_seconds",
        "Duration of each WorkflowEngine call, by method and gRPC status code",
        ("rpc_system", "rpc_service", "rpc_method", "rpc_grpc_status_code"),
        FAST_BUCKETS,
    )
    workflows_started: _Counter = _counter(
        "workflow_engine_workflows_started_total", "Workflows StartWorkflow started"
    )
    workflows_finished: _Counter = _counter(
        "workflow_engine_workflows_finished_total",
        "Workflows that ended, by status (SUCCEEDED, FAILED, CANCELLED)",
        ("status",),
    )
    workflow_duration: _Histogram = _histogram(
        "gen_ai_workflow_duration_seconds",
        "Workflows from their first start to their end, by final status",
        ("status",),
        DURATION_BUCKETS,
    )
    node_duration: _Histogram = _histogram(
        "workflow_engine_node_duration_seconds",
        "Each graph node's run, from its start to its checkpoint being durable",
        ("node",),
        DURATION_BUCKETS,
    )
    checkpoint_write: _Histogram = _histogram(
        "workflow_engine_checkpoint_write_duration_seconds",
        "Each group commit of checkpoint rows, from sending to committed",
        (),
        FAST_BUCKETS,
    )
    checkpoint_batch: _Histogram = _histogram(
        "workflow_engine_checkpoint_batch_size",
        "Checkpoint rows per group commit",
        (),
        BATCH_BUCKETS,
    )
    lease_events: _Counter = _counter(
        "workflow_engine_lease_events_total",
        "Leases acquired (start, resume, recovery), renewed, lost and released",
        ("event",),
    )
    recovery_adoptions: _Counter = _counter(
        "workflow_engine_recovery_adoptions_total",
        "Workflows this process adopted from a runner that stopped or died",
    )
    schedule_fires: _Counter = _counter(
        "workflow_engine_schedule_fires_total",
        "Schedule slots this process handled, by outcome (started, taken, skipped, missed, failed)",
        ("outcome",),
    )
    approvals_expired: _Counter = _counter(
        "workflow_engine_approvals_expired_total",
        "Approval requests that expired and were applied by this process's timer sweep, "
        "by action (reject, suspend)",
        ("action",),
    )
    unreadable_workflows: _Gauge = _gauge(
        "workflow_engine_unreadable_workflows",
        "Unfinished workflows whose rows a newer engine wrote in a state format this engine "
        "does not read, which it leaves alone (a rolling deploy under way)",
        summed="max",
    )
    # Several engine processes each set it: their files are read as their maximum, one series.
    build_info: _Gauge = _gauge(
        "workflow_engine_build_info",
        "Always 1: which engine serves (version, python) and how its jobwrap was built "
        "(static, dynamic, absent)",
        ("version", "python", "jobwrap"),
        summed="max",
    )
    retention_workflows: _Counter = _counter(
        "workflow_engine_retention_pruned_workflows_total",
        "Finished workflows whose events and task retention removed",
    )
    retention_rows: _Counter = _counter(
        "workflow_engine_retention_removed_rows_total",
        "Rows retention deleted, by table (workflow_events, workflow_tasks, ...)",
        ("table",),
    )
    retention_last_round: _Gauge = _gauge(
        "workflow_engine_retention_last_round_timestamp_seconds",
        "When this engine last finished a retention round with nothing left due",
        summed="max",
    )
    jobs_in_flight: _Gauge = _gauge(
        "workflow_engine_jobs_in_flight",
        "Jobs running now, by worker target (local, or a node's name)",
        ("worker",),
        summed="livesum",
    )
    # Several engine processes each set it: the largest of the live ones, one series each.
    held_entries: _Gauge = _gauge(
        "workflow_engine_held_entries",
        "Entries an engine holds in memory, by structure keyed by an id (domain/held.py), with "
        "its bound: 0 when they end with their workflows, jobs or watchers, else the most a "
        "cache keeps",
        ("structure", "bound"),
        summed="livemax",
    )
    job_duration: _Histogram = _histogram(
        "workflow_engine_job_duration_seconds",
        "Jobs from start to result, by worker target and result status",
        ("worker", "status"),
        DURATION_BUCKETS,
    )
    model_duration: _Histogram = _histogram(
        "gen_ai_client_operation_duration_seconds",
        "Model calls of the llm planner and verifier (error_type set when one failed)",
        (*_MODEL_LABELS, "error_type"),
        DURATION_BUCKETS,
    )
    model_tokens: _Histogram = _histogram(
        "gen_ai_client_token_usage",
        "Tokens per model call, input (prompt) and output (completion)",
        (*_MODEL_LABELS, "gen_ai_token_type"),
        TOKEN_BUCKETS,
    )

    @classmethod
    def made_in(cls, registry: CollectorRegistry) -> _Instruments:
        """Every metric made in `registry`."""
        return cls(**{f.name: f.metadata["make"](registry) for f in fields(cls)})


#: prometheus_client's own variable: where each process of several records its values.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def serve_metrics(listen: str, registry: CollectorRegistry) -> Any:
    """Serve `registry` as ``/metrics`` on `listen` (HOST:PORT) from a thread; the server
    (its `shutdown` stops it) and the port it took (port 0 picks one)."""
    host, _, port = listen.rpartition(":")
    server, _thread = start_http_server(int(port), addr=host.strip("[]"), registry=registry)
    return server, server.server_address[1]


def summed_registry(directory: str) -> CollectorRegistry:
    """A registry that reads every engine process's values from `directory` and sums them."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    return registry
