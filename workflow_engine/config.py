"""The engine's settings: one frozen object, read once at start-up and passed down.

Every setting comes from a ``WORKFLOW_ENGINE_*`` environment variable, and the command line may
override it. No other module reads the environment. A capability's own settings are a section:
a frozen dataclass field of `Settings` whose variables are ``WORKFLOW_ENGINE_<SECTION>_<FIELD>``
(`JobSettings` is ``settings.job``, from ``WORKFLOW_ENGINE_JOB_TIMEOUT_SECONDS``...); a new
capability adds its section here and reads it in its factory entry.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_type_hints

from workflow_engine.domain.jobs import MAX_LIMIT

# The Worker API's largest job timeout: a node's own cap may be lower, never higher.
from workflow_engine.domain.task import MAX_TIMEOUT_SECONDS
from workflow_engine.errors import ConfigError

ENV_PREFIX = "WORKFLOW_ENGINE_"
PREPARE_MODES = ("auto", "off")
#: Most engine processes one `serve` runs.
MAX_PROCESSES = 64
#: `listen_database_url` value that turns watch notifications off.
LISTEN_NONE = "none"
#: Where the ``nodes`` worker finds its nodes (`NodesSettings.source`).
NODE_SOURCES = ("file", "orchestrator")
#: The user ids of local jobs when the engine runs as root: above any a system gives its own
#: users (and below 2**31, which some tools take for negative).
JOB_UID_BASE = 2_000_000_000
JOB_UID_COUNT = 1 << 24
JOB_RETENTION_SECONDS = 7 * 24 * 3600.0


def _default_holder_id() -> str:
    # Unique per process: a restarted process is a new holder and must wait for its old lease
    # to expire unless the orchestrator resumes with an explicit, stable holder_id.
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobLimits:
    """The most each local job may use (``..._LIMITS_*``); 0: no limit. A step may ask for less.

    See `domain.jobs.Limits` for what each one counts.
    """

    cpu_seconds: int = 3600
    memory_mb: int = 8192
    open_files: int = 1024
    processes: int = 512
    output_mb: int = 1024

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "memory_mb", "open_files", "processes", "output_mb"):
            if not 0 <= getattr(self, name) <= MAX_LIMIT:
                raise ConfigError(f"{name.upper()}: expected 0 (none) to {MAX_LIMIT}")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSettings:
    """The local sandbox's jobs (``WORKFLOW_ENGINE_JOB_*``)."""

    #: Default and maximum time of a job.
    timeout_seconds: int = 3600
    #: Output of each stream a result keeps.
    output_bytes: int = 64 * 1024
    #: The most each job may use.
    limits: JobLimits = field(default_factory=JobLimits)
    #: When the engine runs as root, each job runs as its own user id, picked from `uid_count`
    #: ids starting at `uid_base` by a digest of its task id (no passwd entry needed).
    uid_base: int = JOB_UID_BASE
    uid_count: int = JOB_UID_COUNT
    #: How long a finished job's directory (``<data_dir>/jobs/<job_id>/``) is kept after its
    #: result, then removed; within it a job id sent again gets the first run's result, after
    #: it the job runs again. 0: kept for good.
    retention_seconds: float = JOB_RETENTION_SECONDS

    def __post_init__(self) -> None:
        if not 0 <= self.retention_seconds < math.inf:
            raise ConfigError(
                f"{ENV_PREFIX}JOB_RETENTION_SECONDS: expected 0 (keep) or more seconds"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class McpSettings:
    """The ``mcp`` task source: the orchestrator's MCP server (``WORKFLOW_ENGINE_MCP_*``)."""

    #: Its streamable HTTP endpoint, e.g. ``http://orchestrator:8083/mcp``; required for ``mcp``.
    url: str = ""
    #: The tool that returns a task by ``task_id``.
    task_tool: str = "db.task.get"
    #: The tool that returns a task's effective preferences by ``task_id``.
    preferences_tool: str = "db.preference.effective"
    #: How long one load (connect, both calls) may take before the source is unavailable.
    timeout_seconds: float = 10.0
    #: Sent as ``Authorization: Bearer <token>`` when set; never logged.
    bearer_token: str = field(default="", repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSettings:
    """`workflow-engine worker-node`: our own Worker API node (``WORKFLOW_ENGINE_NODE_*``).

    The engine itself reads none of these; the node reads only these and the log level.
    """

    #: host:port the node's HTTP server listens on; port 0 picks a free one (logged at start).
    listen: str = "127.0.0.1:8090"
    #: Its own data directory: the job directories that make each job_id run once, restarts
    #: included. Never share it with an engine or another node.
    data_dir: Path = Path(".data/node")
    #: The bearer token every job request must carry; required to start; never logged.
    token: str = field(default="", repr=False)
    #: Largest request body accepted (413 above it): 10 MiB, as their node.
    max_body_bytes: int = 10 * 1024 * 1024
    #: A job's timeout when its request gives none (their node's default); capped by the next.
    default_timeout_seconds: int = 300
    #: The cap on any job's timeout: the Worker API's node default, at most its maximum.
    max_timeout_seconds: int = 3600
    #: Output of each stream a result keeps.
    output_bytes: int = 64 * 1024
    #: The most each job may use (``WORKFLOW_ENGINE_NODE_LIMITS_*``), and the user ids of its
    #: jobs when the node runs as root: as the engine's ``WORKFLOW_ENGINE_JOB_*`` ones.
    limits: JobLimits = field(default_factory=JobLimits)
    job_uid_base: int = JOB_UID_BASE
    job_uid_count: int = JOB_UID_COUNT
    #: How long a finished job's directory is kept after its result (as the engine's
    #: ``WORKFLOW_ENGINE_JOB_RETENTION_SECONDS``); 0: kept for good.
    job_retention_seconds: float = JOB_RETENTION_SECONDS
    #: How long SIGTERM lets running jobs finish before the node exits.
    drain_seconds: float = 30.0
    #: While a file exists at this path, /readyz answers 503 (take a node out of rotation by
    #: hand, or in tests); empty: none.
    not_ready_file: str = ""
    #: TLS on the node's port: its certificate chain and key (PEM files; both or neither). The
    #: port then speaks HTTPS only.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    #: Serve plaintext HTTP on an address other than loopback (the token and every job in
    #: clear, for anyone on the network to read): refused unless set.
    allow_plaintext_remote: bool = False

    def __post_init__(self) -> None:
        prefix = f"{ENV_PREFIX}NODE_"
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError(
                f"{prefix}TLS_CERT_FILE and {prefix}TLS_KEY_FILE: give both or neither"
            )
        if not 0 < self.max_timeout_seconds <= MAX_TIMEOUT_SECONDS:
            raise ConfigError(
                f"{prefix}MAX_TIMEOUT_SECONDS: expected 1 to {MAX_TIMEOUT_SECONDS}, "
                f"got {self.max_timeout_seconds}"
            )
        if not 0 < self.default_timeout_seconds <= MAX_TIMEOUT_SECONDS:
            raise ConfigError(
                f"{prefix}DEFAULT_TIMEOUT_SECONDS: expected 1 to {MAX_TIMEOUT_SECONDS}, "
                f"got {self.default_timeout_seconds}"
            )
        if self.max_body_bytes <= 0:
            raise ConfigError(f"{prefix}MAX_BODY_BYTES: expected a positive number of bytes")
        if self.output_bytes <= 0:
            raise ConfigError(f"{prefix}OUTPUT_BYTES: expected a positive number of bytes")
        if self.drain_seconds < 0:
            raise ConfigError(f"{prefix}DRAIN_SECONDS: expected 0 or more seconds")
        if not 0 <= self.job_retention_seconds < math.inf:
            raise ConfigError(f"{prefix}JOB_RETENTION_SECONDS: expected 0 (keep) or more seconds")

    def check_exposure(self) -> None:
        """Refuse to serve plaintext beyond this host (the bearer token and the jobs' commands,
        environments and output would cross the network in clear), unless
        `allow_plaintext_remote` says so."""
        prefix = f"{ENV_PREFIX}NODE_"
        if self.allow_plaintext_remote or not self.plaintext_remote:
            return
        raise ConfigError(
            f"{prefix}LISTEN={self.listen} is reachable from other hosts, but there is no TLS "
            f"({prefix}TLS_CERT_FILE and {prefix}TLS_KEY_FILE): the node's bearer token and "
            "every job's command, environment and output would cross the network in clear. "
            f"Configure them, listen on 127.0.0.1, or set {prefix}ALLOW_PLAINTEXT_REMOTE=true "
            "for a network you trust with that."
        )

    @property
    def plaintext_remote(self) -> bool:
        """The node serves plaintext on an address other hosts may reach."""
        return not self.tls_cert_file and not is_loopback(self.listen.rsplit(":", 1)[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class NodesSettings:
    """The ``nodes`` worker: jobs sent to worker nodes over the Worker API
    (``WORKFLOW_ENGINE_NODES_*``)."""

    #: Where the nodes come from: "file" (`file`) or "orchestrator" (the orchestrator's
    #: ``nodes`` table and capability snapshots, in the engine's database, re-read every
    #: `refresh_seconds`). Empty: "file" when `file` is set, else "orchestrator".
    source: str = ""
    #: A YAML or JSON list of nodes (name, url, token_env or token_file, labels, max_jobs);
    #: required when `source` is "file".
    file: str = ""
    #: How often the "orchestrator" source is read again: nodes that joined get jobs, nodes
    #: that left or were disabled get no new ones.
    refresh_seconds: float = 30.0
    #: How often each node's ``GET /readyz`` is asked; a node that fails it gets no new jobs.
    health_interval_seconds: float = 5.0
    #: How long a dispatch waits for an eligible node (labels, health, room) before its attempt
    #: fails with the reason.
    wait_seconds: float = 30.0
    #: How long one job's request is retried (same job id, with backoff) while its node cannot
    #: be reached or answers 5xx, before the attempt is reported lost.
    retry_seconds: float = 30.0
    #: How long connecting to a node may take.
    connect_timeout_seconds: float = 5.0
    #: The CA certificates (PEM) an ``https://`` node's certificate must chain to, instead of
    #: the default ones (a private CA); empty: the HTTP client's default CAs.
    ca_file: str = ""
    #: Send jobs to ``http://`` nodes beyond loopback, whose token and jobs then cross the
    #: network in clear: such a node is refused (the nodes file at start, a table row as
    #: unusable) unless this says the network between the engine and its nodes is trusted.
    allow_plaintext_remote: bool = False

    @property
    def effective_source(self) -> str:
        """`source`, or the default it stands for when empty."""
        return self.source or ("file" if self.file else "orchestrator")


#: How a model is asked for JSON, most enforced first (see `capabilities.model.model_client`).
OUTPUT_MODES = ("json_schema", "json_object_schema", "json_object", "text")
#: The answer's token limit per purpose when no setting gives one: enough for a plan of a few
#: steps, a verdict with its findings, a summary, and short enough that a model that rambles
#: is cut in seconds, not minutes.
DEFAULT_MAX_TOKENS = {"plan": 1024, "revise": 512, "verify": 512, "summary": 512}


@dataclass(frozen=True, slots=True, kw_only=True)
class LlmSettings:
    """The model the ``llm`` planner and verifier ask (``WORKFLOW_ENGINE_LLM_*``): any
    OpenAI-compatible Chat Completions endpoint."""

    #: The endpoint, e.g. ``http://127.0.0.1:8000/v1`` (vLLM) or ``https://api.openai.com/v1``.
    base_url: str = ""
    #: The model's name as the endpoint knows it.
    model: str = ""
    #: Sent as the bearer token; never logged. Or `api_key_file`, read once at start-up.
    api_key: str = field(default="", repr=False)
    api_key_file: str = ""
    #: How long one request may take (a slower answer is retried, as a timeout).
    timeout_seconds: float = 60.0
    #: The answer's token limit for every purpose that has none of its own (0: each purpose's
    #: default, `DEFAULT_MAX_TOKENS`). An answer cut there is asked for again, shorter, and
    #: fails the call when every attempt is cut; its tokens count in the budget either way.
    max_tokens: int = 0
    #: The token limits of a plan (and a step's revision), a verdict and a summary (0: above).
    plan_max_tokens: int = 0
    verify_max_tokens: int = 0
    summary_max_tokens: int = 0
    #: Stop sequences sent with every call, as a JSON array of strings (empty: none).
    stop: str = ""
    #: How answers are asked for: ``auto`` walks `OUTPUT_MODES` down from the first until the
    #: server takes one, and remembers it; or one of them, always.
    output_mode: str = "auto"
    #: What the prompts and schemas ask for: ``full``, or ``small`` for sub-billion models
    #: (id, command and checks only; shorter instructions).
    profile: str = "full"
    temperature: float = 0.0
    #: Tries after the first for a timeout, a connection error, 429 or 5xx; backoff between
    #: them doubles from 0.5 s up to `retry_max_seconds` (a 429's Retry-After wins).
    retries: int = 3
    retry_max_seconds: float = 10.0
    #: Times an invalid plan is asked for again (with what was wrong) before the workflow fails.
    plan_attempts: int = 3
    #: Characters of each of stdout and stderr the verifier shows the model, at most.
    excerpt_chars: int = 4000
    #: Whether a failed verification has the planner revise the step for its next attempt.
    revise: bool = True
    #: Whether `finalize_summary` asks the model for the summary (today's summary otherwise).
    summary: bool = False

    def answer_profile(self) -> Literal["full", "small"]:
        """`profile`, as the prompts and schemas take it."""
        return "small" if self.profile == "small" else "full"

    def tokens_for(self, purpose: str) -> int:
        """The answer's token limit for `purpose` (plan, revise, verify, summary)."""
        own = {
            "plan": self.plan_max_tokens,
            "revise": self.plan_max_tokens,
            "verify": self.verify_max_tokens,
            "summary": self.summary_max_tokens,
        }.get(purpose, 0)
        return own or self.max_tokens or DEFAULT_MAX_TOKENS.get(purpose, 1024)

    def stop_sequences(self) -> list[str]:
        """`stop` as a list; `ConfigError` naming the variable when it is not one."""
        if not self.stop:
            return []
        try:
            sequences = json.loads(self.stop)
        except ValueError:
            sequences = None
        if (
            not isinstance(sequences, list)
            or not 1 <= len(sequences) <= 4
            or not all(isinstance(s, str) and 0 < len(s) <= 64 for s in sequences)
        ):
            raise ConfigError(
                f"{ENV_PREFIX}LLM_STOP: expected a JSON array of 1 to 4 non-empty strings "
                '(at most 64 characters each), e.g. ["\\n\\n\\n"]'
            )
        return sequences

    def check(self, planner: str, verifier: str) -> None:
        """Refuse settings a model capability cannot run with, naming the variable."""
        prefix = f"{ENV_PREFIX}LLM_"
        if "llm" not in (planner, verifier):
            return
        if not self.base_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"{prefix}BASE_URL: required when {ENV_PREFIX}PLANNER or {ENV_PREFIX}VERIFIER "
                f"is llm (an http(s) URL such as http://127.0.0.1:8000/v1), got {self.base_url!r}"
            )
        if not self.model:
            raise ConfigError(f"{prefix}MODEL: required when the planner or verifier is llm")
        if self.api_key and self.api_key_file:
            raise ConfigError(f"{prefix}API_KEY_FILE: set, and so is {prefix}API_KEY; set one")
        if not 0 < self.timeout_seconds <= 3600:
            raise ConfigError(f"{prefix}TIMEOUT_SECONDS: expected 0 < seconds <= 3600")
        for name in ("plan_attempts", "excerpt_chars"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{prefix}{name.upper()}: expected 1 or more")
        for name in ("max_tokens", "plan_max_tokens", "verify_max_tokens", "summary_max_tokens"):
            if not 0 <= getattr(self, name) <= 1_000_000:
                raise ConfigError(f"{prefix}{name.upper()}: expected 0 (the default) to 1000000")
        if self.output_mode not in ("auto", *OUTPUT_MODES):
            raise ConfigError(
                f"{prefix}OUTPUT_MODE: expected auto or one of {', '.join(OUTPUT_MODES)}, "
                f"got {self.output_mode!r}"
            )
        if self.profile not in ("full", "small"):
            raise ConfigError(f"{prefix}PROFILE: expected full or small, got {self.profile!r}")
        self.stop_sequences()
        if not 0 <= self.retries <= 20:
            raise ConfigError(f"{prefix}RETRIES: expected 0 to 20")


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
    #: tenant (the task's project) with the fewest running (`capabilities.fair_slots`).
    max_running_jobs: int = 64
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
    #: Fault injection for the fault suite only; see `workflow_engine.faults`.
    faults: str = ""
    #: Which implementation each capability uses (see `capabilities.factory` for the choices).
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
    compressor: str = "truncate"
    #: The ``mcp`` task source's server, tools and timeout.
    mcp: McpSettings = field(default_factory=McpSettings)
    #: `workflow-engine worker-node`'s own settings.
    node: NodeSettings = field(default_factory=NodeSettings)
    #: The ``nodes`` worker's nodes file, health polling, waits and retries.
    nodes: NodesSettings = field(default_factory=NodesSettings)
    #: The model of the ``llm`` planner and verifier.
    llm: LlmSettings = field(default_factory=LlmSettings)
    #: Which model-planned commands run, wait for approval or are refused (see
    #: `capabilities.model.command_policy`); empty: every one waits for approval.
    command_policy_file: str = ""
    #: The ``job`` verifier's command (split as a shell would, run as argv on the worker): the
    #: Project Analyst, given what to judge in ``WORKFLOW_ENGINE_VERIFY_INPUT``, prints its
    #: verdict as a JSON line (see `capabilities.job_verifier`).
    verifier_command: str = ""
    #: Log level for the JSON logs on stderr (debug, info, warning, error).
    log_level: str = "info"
    #: TLS on the gRPC port: the server's certificate chain and key (PEM files; both or
    #: neither), and a CA whose client certificates are required and name the caller (mutual
    #: TLS; see `api.auth`).
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    #: The callers, their tokens and roles (JSON; see `api.auth`). Empty: no tokens.
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


def settings_from_env(environ: Mapping[str, str] | None = None) -> Settings:
    """Build `Settings` from ``WORKFLOW_ENGINE_<FIELD>`` variables; unknown ones are ignored."""
    environ = os.environ if environ is None else environ
    settings: Settings = _from_env(Settings, environ, ENV_PREFIX)
    return settings


def env_names(kind: type = Settings, prefix: str = ENV_PREFIX) -> set[str]:
    """Every variable the settings read."""
    names: set[str] = set()
    for name, hint in _fields(kind).items():
        if is_dataclass(hint):
            names |= env_names(hint, f"{prefix}{name.upper()}_")  # type: ignore[arg-type]
        else:
            names.add(prefix + name.upper())
    return names


def _from_env(kind: type, environ: Mapping[str, str], prefix: str) -> Any:
    values: dict[str, Any] = {}
    for name, hint in _fields(kind).items():
        if is_dataclass(hint):
            values[name] = _from_env(hint, environ, f"{prefix}{name.upper()}_")  # type: ignore[arg-type]
            continue
        raw = environ.get(prefix + name.upper())
        if raw is None or raw == "":
            continue
        values[name] = _parse(prefix + name.upper(), hint.__name__, raw)
    try:
        return kind(**values)
    except ValueError as exc:
        if str(exc).startswith(ENV_PREFIX):
            raise
        # A settings group used under several prefixes names its fields alone (`JobLimits`).
        raise ConfigError(f"{prefix}{exc}") from None


def _fields(kind: type) -> dict[str, Any]:
    """A settings dataclass's fields and their (resolved) types."""
    hints = get_type_hints(kind)
    return {f.name: hints[f.name] for f in fields(kind)}


def _parse(variable: str, kind: str, raw: str) -> Any:
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "Path":
            return Path(raw)
        if kind == "bool":
            if raw.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError(raw)  # caught below: named with its variable
            return raw.lower() in ("1", "true", "yes", "on")
    except ValueError:
        raise ConfigError(f"{variable}: expected {kind}, got {raw!r}") from None
    return raw


def is_loopback(host: str) -> bool:
    """`host` (a name or address, IPv6 in brackets or not) is this host's loopback only."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name, or an unspecified address such as 0.0.0.0: not only this host
