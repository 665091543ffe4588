"""`Settings`: what the engine needs to know to run, with its sections (`config._sections`)."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from workflow_engine.config._sections import (
    ENV_PREFIX,
    NODE_SOURCES,
    JobSettings,
    LlmSettings,
    McpSettings,
    NodeSettings,
    NodesSettings,
    RetentionSettings,
    is_loopback,
)
from workflow_engine.domain.jobs import MAX_LIMIT
from workflow_engine.errors import ConfigError

PREPARE_MODES = ("auto", "off")
#: Most engine processes one `serve` runs.
MAX_PROCESSES = 64
#: `listen_database_url` value that turns watch notifications off.
LISTEN_NONE = "none"


def _default_holder_id() -> str:
    # Unique per process: a restarted process is a new holder and must wait for its old lease
    # to expire unless the orchestrator resumes with an explicit, stable holder_id.
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """What the engine needs to know to run. Defaults suit a single developer machine."""

    #: PostgreSQL connection URL; empty means an embedded server under `data_dir`.
    database_url: str = ""
    #: host:port the gRPC server listens on; port 0 picks a free one (logged at start).
    listen: str = "127.0.0.1:50051"
    #: Where the embedded database and the local sandbox's job directories live.
    data_dir: Path = Path(".data")
    #: Default lease time to live; a running workflow renews it every third of that.
    lease_ttl_seconds: int = 30
    #: This engine's identity as a lease holder, when a request does not name one. Every engine
    #: process `serve` starts holds leases under this same id (what the orchestrator sees).
    holder_id: str = field(default_factory=_default_holder_id)
    #: This engine process's name, recorded with each lease it takes (`holder_process`): set by
    #: `serve` for each process it starts (the holder id and the process's slot, e.g.
    #: ``engine-a/2``, kept when the process is restarted); empty means the holder id.
    process_name: str = ""
    #: Engine processes `serve` runs, sharing the port (see `supervisor`); 1 runs the engine in
    #: the process itself. Default: the cores this process may use.
    processes: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    #: Connection pool bounds.
    pool_min_size: int = 2
    pool_max_size: int = 10
    #: Server-side prepared statements: "auto" prepares a statement once it has run a few times
    #: on a connection (psycopg's default); "off" never prepares, as a transaction-mode pooler
    #: that does not track prepared statements (PgBouncer before 1.21) requires.
    database_prepare: str = "auto"
    #: Where watch notifications are LISTENed for: empty means `database_url`; a URL (direct to
    #: PostgreSQL, or through a session-mode pool) when `database_url` is a transaction-mode
    #: pooler; "none" turns notifications off: watchers poll every `watch_poll_seconds`.
    listen_database_url: str = ""
    #: How often a watcher re-reads its workflow's events without a notification: the longest
    #: an event waits when notifications are off or lost.
    watch_poll_seconds: float = 1.0
    #: How long SIGTERM waits for running workflows to reach a node boundary.
    drain_timeout_seconds: float = 20.0
    #: Largest request the gRPC server accepts, in bytes.
    max_message_bytes: int = 4 * 1024 * 1024
    #: Local sandbox: default and maximum job time, and how much output a result keeps.
    job: JobSettings = field(default_factory=JobSettings)
    #: Jobs running at once in this process, across all workflows (each workflow is also bounded
    #: by its task's max_parallel_steps). While jobs wait for one, a slot that frees goes to the
    #: tenant (the task's project) with the fewest running (`capabilities._fair_slots`).
    max_running_jobs: int = 64
    #: A tenant is a project; a caller scoped to users only (which may name any project)
    #: counts as its user (see docs/security.md, "Tenants").
    #: One tenant's jobs running at once in this process, at most, even while slots are free;
    #: 0: no cap beyond `max_running_jobs` (fair sharing already keeps a tenant's flood from
    #: delaying another's next job by more than one slot, and a cap idles slots).
    max_running_jobs_per_tenant: int = 0
    #: One tenant's workflows running in this process at once, at most: a StartWorkflow or a
    #: ResumeWorkflow (or an override) that would run one more is RESOURCE_EXHAUSTED, nothing
    #: stored (automatic recovery adopts regardless). 0: no cap (one tenant may have the
    #: 10,000 in flight `benchmarks/inflight.py` measures).
    max_running_workflows_per_tenant: int = 0
    #: WatchWorkflow streams one caller (its authenticated identity; without callers, everyone
    #: together) may have open on this process at once; one more is RESOURCE_EXHAUSTED. Each
    #: open watch reads the database every `watch_poll_seconds` while its workflow is quiet.
    #: 0: no cap (an orchestrator may watch every workflow it runs).
    max_watches_per_caller: int = 0
    #: Characters of earlier steps' output handed to each dispatch as context, at most.
    context_budget_chars: int = 8000
    #: Automatic recovery: adopt RUNNING workflows whose lease was released or expired, every
    #: `recovery_interval_seconds`; fail one adopted more than `recovery_max_attempts` times
    #: without progress.
    recovery_enabled: bool = True
    recovery_interval_seconds: float = 5.0
    recovery_max_attempts: int = 5
    #: What is kept of finished workflows, and for how long (see `runtime._retention`).
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    #: How often each replica looks for what time makes due: approval requests that expired,
    #: waiting workflows past their deadline, and schedule slots. The most a timer fires late.
    timer_interval_seconds: float = 1.0
    #: Fire schedules on this replica (every replica may: each slot fires once across them).
    schedules_enabled: bool = True
    #: A slot fired later than this after its time counts as missed (the engine was down): the
    #: schedule's catch-up policy decides whether it still starts a workflow.
    schedule_missed_after_seconds: float = 60.0
    #: Fault injection for the fault suite only; see `workflow_engine._faults`.
    faults: str = ""
    #: Which implementation each capability uses (see `capabilities._factory` for the choices).
    #: Worker: "sandbox" (local processes), "nodes" (worker nodes over the Worker API, see
    #: `nodes`) or "simulated" (in-process true / echo / sleep, for benchmarks and dry runs).
    worker: str = "sandbox"
    #: Task source (where StartWorkflow loads a task sent without one, by id): "inline" (none;
    #: the orchestrator's tasks table when the database has it), "orchestrator" (that table),
    #: "mcp" (the orchestrator's MCP server, see `mcp`).
    task_source: str = "inline"
    #: Planner: "static" (the task's steps or its prompt's `$ command` lines) or "llm" (a
    #: model, see `llm`). Verifier: "checks" (machine checks), "llm" (machine checks, then a
    #: model's judgement) or "job" (machine checks, then a verification job on the worker).
    planner: str = "static"
    verifier: str = "checks"
    #: The ``mcp`` task source's server, tools and timeout.
    mcp: McpSettings = field(default_factory=McpSettings)
    #: `workflow-engine worker-node`'s own settings.
    node: NodeSettings = field(default_factory=NodeSettings)
    #: The ``nodes`` worker's nodes file, health polling, waits and retries.
    nodes: NodesSettings = field(default_factory=NodesSettings)
    #: The model of the ``llm`` planner and verifier.
    llm: LlmSettings = field(default_factory=LlmSettings)
    #: Which model-planned commands run, wait for approval or are refused (see
    #: `capabilities.model._command_policy`); empty: every one waits for approval.
    command_policy_file: str = ""
    #: The ``job`` verifier's command (split as a shell would, run as argv on the worker): the
    #: Project Analyst, given what to judge in ``WORKFLOW_ENGINE_VERIFY_INPUT``, prints its
    #: verdict as a JSON line (see `capabilities._job_verifier`).
    verifier_command: str = ""
    #: Log level for the JSON logs on stderr (debug, info, warning, error).
    log_level: str = "info"
    #: TLS on the gRPC port: the server's certificate chain and key (PEM files; both or
    #: neither), and a CA whose client certificates are required and name the caller (mutual
    #: TLS; see `api._auth`).
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    #: The callers, their tokens and roles (JSON; see `api._auth`). Empty: no tokens.
    tokens_file: str = ""
    #: Serve on an address other than loopback without TLS and callers: refused unless set.
    allow_insecure_remote: bool = False
    #: gRPC server reflection (for grpcurl without the .proto).
    reflection: bool = True
    #: host:port of a second, plaintext listener serving only grpc.health.v1, for probes that
    #: cannot speak TLS (Kubernetes' gRPC probes). Empty: none.
    health_listen: str = ""
    #: How often health re-checks that the database answers and the data directory is
    #: writable (NOT_SERVING while either fails).
    readiness_interval_seconds: float = 5.0
    #: host:port serving Prometheus metrics at /metrics (plain HTTP; port 0 picks one, logged).
    #: Empty: metrics are off.
    metrics_listen: str = ""

    def __post_init__(self) -> None:
        if self.database_prepare not in PREPARE_MODES:
            raise ConfigError(
                f"{ENV_PREFIX}DATABASE_PREPARE: expected one of {', '.join(PREPARE_MODES)}, "
                f"got {self.database_prepare!r}"
            )
        if not 0 < self.watch_poll_seconds <= 60:
            raise ConfigError(f"{ENV_PREFIX}WATCH_POLL_SECONDS: expected 0 < seconds <= 60")
        if not 0 < self.readiness_interval_seconds <= 300:
            raise ConfigError(
                f"{ENV_PREFIX}READINESS_INTERVAL_SECONDS: expected 0 < seconds <= 300"
            )
        if not 0 < self.timer_interval_seconds <= 60:
            raise ConfigError(f"{ENV_PREFIX}TIMER_INTERVAL_SECONDS: expected 0 < seconds <= 60")
        if not 0 < self.schedule_missed_after_seconds <= 86400:
            raise ConfigError(
                f"{ENV_PREFIX}SCHEDULE_MISSED_AFTER_SECONDS: expected 0 < seconds <= 86400"
            )
        if not 1 <= self.processes <= MAX_PROCESSES:
            raise ConfigError(f"{ENV_PREFIX}PROCESSES: expected 1 to {MAX_PROCESSES}")
        self._check_limits()
        if self.task_source == "mcp" and not self.mcp.url:
            raise ConfigError(f"{ENV_PREFIX}MCP_URL: required when {ENV_PREFIX}TASK_SOURCE is mcp")
        if not 0 < self.mcp.timeout_seconds <= 300:
            raise ConfigError(f"{ENV_PREFIX}MCP_TIMEOUT_SECONDS: expected 0 < seconds <= 300")
        self._check_nodes()
        self._check_tls()
        metrics_host, _, metrics_port = self.metrics_listen.rpartition(":")
        if self.metrics_listen and not (metrics_host and metrics_port.isdigit()):
            raise ConfigError(
                f"{ENV_PREFIX}METRICS_LISTEN: expected HOST:PORT, got {self.metrics_listen!r}"
            )
        self.llm.check(self.planner, self.verifier)
        if self.verifier == "job" and not self.verifier_command.strip():
            raise ConfigError(
                f"{ENV_PREFIX}VERIFIER_COMMAND: required when {ENV_PREFIX}VERIFIER is job"
            )

    def _check_limits(self) -> None:
        if not 1 <= self.max_running_jobs <= MAX_LIMIT:
            raise ConfigError(f"{ENV_PREFIX}MAX_RUNNING_JOBS: expected 1 to {MAX_LIMIT}")
        for name in (
            "max_running_jobs_per_tenant",
            "max_running_workflows_per_tenant",
            "max_watches_per_caller",
        ):
            if not 0 <= getattr(self, name) <= MAX_LIMIT:
                raise ConfigError(f"{ENV_PREFIX}{name.upper()}: expected 0 (no cap) to {MAX_LIMIT}")

    def _check_tls(self) -> None:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError(
                f"{ENV_PREFIX}TLS_CERT_FILE and {ENV_PREFIX}TLS_KEY_FILE: give both or neither"
            )
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ConfigError(
                f"{ENV_PREFIX}TLS_CLIENT_CA_FILE: needs {ENV_PREFIX}TLS_CERT_FILE and "
                f"{ENV_PREFIX}TLS_KEY_FILE (client certificates are checked over TLS)"
            )

    @property
    def authenticates(self) -> bool:
        """Callers must prove who they are (tokens, or client certificates)."""
        return bool(self.tokens_file or self.tls_client_ca_file)

    def check_exposure(self) -> None:
        """Refuse to serve an unauthenticated, unencrypted API beyond this host (it runs
        commands), unless `allow_insecure_remote` says so."""
        host = self.listen.rsplit(":", 1)[0]
        if is_loopback(host) or self.allow_insecure_remote:
            return
        missing = [
            what
            for what, given in (("TLS", self.tls_cert_file), ("callers", self.authenticates))
            if not given
        ]
        if missing:
            raise ConfigError(
                f"{ENV_PREFIX}LISTEN={self.listen} is reachable from other hosts, but there is "
                f"no {' and no '.join(missing)} ({ENV_PREFIX}TLS_CERT_FILE/_KEY_FILE, "
                f"{ENV_PREFIX}TOKENS_FILE or {ENV_PREFIX}TLS_CLIENT_CA_FILE): anyone who can "
                "reach it could run commands on this host. Configure them, listen on "
                f"127.0.0.1, or set {ENV_PREFIX}ALLOW_INSECURE_REMOTE=true to accept that."
            )

    def _check_nodes(self) -> None:
        nodes = self.nodes
        if nodes.source not in ("", *NODE_SOURCES):
            raise ConfigError(
                f"{ENV_PREFIX}NODES_SOURCE: expected {' or '.join(NODE_SOURCES)} (or empty), "
                f"got {nodes.source!r}"
            )
        if nodes.source == "file" and not nodes.file:
            raise ConfigError(
                f"{ENV_PREFIX}NODES_FILE: required when {ENV_PREFIX}NODES_SOURCE is file"
            )
        if nodes.source == "orchestrator" and nodes.file:
            raise ConfigError(
                f"{ENV_PREFIX}NODES_FILE: set, but {ENV_PREFIX}NODES_SOURCE is orchestrator "
                "(the orchestrator's nodes table); set only one of them"
            )
        for name in ("health_interval_seconds", "connect_timeout_seconds", "refresh_seconds"):
            if not 0 < getattr(self.nodes, name) <= 3600:
                raise ConfigError(f"{ENV_PREFIX}NODES_{name.upper()}: expected 0 < seconds <= 3600")
        for name in ("wait_seconds", "retry_seconds"):
            if not 0 <= getattr(self.nodes, name) <= 86400:
                raise ConfigError(
                    f"{ENV_PREFIX}NODES_{name.upper()}: expected 0 <= seconds <= 86400"
                )

    @property
    def process(self) -> str:
        """This engine process's name (`process_name`, else the holder id)."""
        return self.process_name or self.holder_id

    @property
    def prepare_threshold(self) -> int | None:
        """psycopg's `prepare_threshold` for `database_prepare` (None: never prepare)."""
        return None if self.database_prepare == "off" else 5

    def listen_url(self, database_url: str) -> str | None:
        """Where to LISTEN, given the URL the pool uses; None: notifications are off."""
        if self.listen_database_url == LISTEN_NONE:
            return None
        return self.listen_database_url or database_url

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def embedded_pgdata(self) -> Path:
        return self.data_dir / "pgdata"

    def with_overrides(self, **overrides: Any) -> Settings:
        """A copy with the given fields replaced; `None` values are ignored."""
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})
