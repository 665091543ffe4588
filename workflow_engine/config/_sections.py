"""The settings' sections: the local jobs, retention, the ``mcp`` task source, the worker node,
the ``nodes`` worker and the model, each a frozen dataclass that `Settings` holds as a field and
reads from ``WORKFLOW_ENGINE_<SECTION>_<FIELD>`` (`config._env`)."""

from __future__ import annotations

import ipaddress
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from workflow_engine.domain.jobs import MAX_LIMIT

# The Worker API's largest job timeout: a node's own cap may be lower, never higher.
from workflow_engine.domain.task import MAX_TIMEOUT_SECONDS
from workflow_engine.errors import ConfigError

ENV_PREFIX = "WORKFLOW_ENGINE_"
#: Where the ``nodes`` worker finds its nodes (`NodesSettings.source`).
NODE_SOURCES = ("file", "orchestrator")
#: The user ids of local jobs when the engine runs as root: above any a system gives its own
#: users (and below 2**31, which some tools take for negative).
JOB_UID_BASE = 2_000_000_000
JOB_UID_COUNT = 1 << 24
JOB_RETENTION_SECONDS = 7 * 24 * 3600.0


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


#: Where a job has its task's own directories: no host directory beneath them is granted.
_JOBS_OWN = ("/tmp", "/dev/shm", "/run")  # noqa: S108 (names, not files it makes)


def writable_paths(value: str, variable: str) -> tuple[str, ...]:
    """`value` (directories separated by ``:``) as a tuple; `ConfigError` naming `variable`
    unless each is absolute, normalized and no job's own directory or beneath one."""
    paths = tuple(p for p in value.split(":") if p)
    for path in paths:
        if not path.startswith("/") or os.path.normpath(path) != path or path == "/":
            raise ConfigError(f"{variable}: {path!r} is not an absolute, normalized directory")
        if any(path == own or path.startswith(own + "/") for own in _JOBS_OWN):
            raise ConfigError(f"{variable}: {path!r} is beneath a job's own {', '.join(_JOBS_OWN)}")
    for path in paths:
        # A job writes in a granted directory: it could plant a link where another grant's
        # path goes through it (jobwrap follows none, and refuses the job then).
        if outer := next((p for p in paths if path.startswith(p + "/")), None):
            raise ConfigError(f"{variable}: {path!r} is beneath {outer!r}, also granted")
    return paths


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSettings:
    """The local sandbox's jobs (``WORKFLOW_ENGINE_JOB_*``)."""

    #: Default and maximum time of a job.
    timeout_seconds: int = 3600
    #: Output of each stream a result keeps.
    output_bytes: int = 64 * 1024
    #: The most each job may use.
    limits: JobLimits = field(default_factory=JobLimits)
    #: When the engine runs as root, each job runs as its own user id, drawn from `uid_count`
    #: ids starting at `uid_base` for its task's run (no passwd entry needed).
    uid_base: int = JOB_UID_BASE
    uid_count: int = JOB_UID_COUNT
    #: How long a finished job's directory (``<data_dir>/jobs/<job_id>/``) is kept after its
    #: result, then removed; within it a job id sent again gets the first run's result, after
    #: it the job runs again. 0: kept for good.
    retention_seconds: float = JOB_RETENTION_SECONDS
    #: Directories of the host every job may write in, separated by ``:`` (absolute, none
    #: beneath /tmp, /dev/shm or /run, which are each task's own): a job sees every other
    #: file of the host read-only. Empty: none.
    writable_paths: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.retention_seconds < math.inf:
            raise ConfigError(
                f"{ENV_PREFIX}JOB_RETENTION_SECONDS: expected 0 (keep) or more seconds"
            )
        self.writable()

    def writable(self) -> tuple[str, ...]:
        """`writable_paths` as a tuple (checked: `ConfigError` naming the variable)."""
        return writable_paths(self.writable_paths, f"{ENV_PREFIX}JOB_WRITABLE_PATHS")


#: The longest retention (a thousand years): PostgreSQL's intervals reach about 178 million.
MAX_RETENTION_DAYS = 365_000


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionSettings:
    """What the engine keeps of finished workflows (``WORKFLOW_ENGINE_RETENTION_*``)."""

    #: A finished workflow's (SUCCEEDED, FAILED, CANCELLED) events, all but the last, and its
    #: stored task are removed this many days after its row last changed, in the background
    #: (one replica at a time); `workflow-engine prune` does it on demand. 0: kept for good.
    days: int = 30
    #: Remove its ``workflow_checkpoints`` row too (which the orchestrator reads), its last
    #: event, and its lease row where the engine took the lease last. A row the engine did not
    #: write is never touched.
    delete_rows: bool = False
    #: Workflows pruned per transaction: each batch is one short transaction.
    batch_size: int = 200
    #: How often each replica looks for finished workflows that are due.
    interval_seconds: float = 600.0

    def __post_init__(self) -> None:
        prefix = f"{ENV_PREFIX}RETENTION_"
        if not 0 <= self.days <= MAX_RETENTION_DAYS:  # PostgreSQL's intervals end before long
            raise ConfigError(
                f"{prefix}DAYS: expected 0 (keep everything) to {MAX_RETENTION_DAYS} days"
            )
        if not 1 <= self.batch_size <= 10_000:
            raise ConfigError(f"{prefix}BATCH_SIZE: expected 1 to 10000")
        if not 0 < self.interval_seconds <= 86400:
            raise ConfigError(f"{prefix}INTERVAL_SECONDS: expected 0 < seconds <= 86400")


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
    #: Open connections at most (each running job's request holds one); one more is closed as
    #: it is made, before anything is read from it.
    max_connections: int = 1024
    #: How long a connection may take to send a request's line and headers, from connecting or
    #: from its last answer; then it is closed (nothing of a request came that could be
    #: answered).
    head_timeout_seconds: float = 20.0
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
    #: Directories of the host every job may write in (as the engine's
    #: ``WORKFLOW_ENGINE_JOB_WRITABLE_PATHS``).
    job_writable_paths: str = ""
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
        self.job_writable()
        if self.max_connections <= 0:
            raise ConfigError(f"{prefix}MAX_CONNECTIONS: expected a positive number")
        if not 0 < self.head_timeout_seconds < math.inf:
            raise ConfigError(
                f"{prefix}HEAD_TIMEOUT_SECONDS: expected a positive number of seconds"
            )
        if not 0 <= self.job_retention_seconds < math.inf:
            raise ConfigError(f"{prefix}JOB_RETENTION_SECONDS: expected 0 (keep) or more seconds")

    def job_writable(self) -> tuple[str, ...]:
        """`job_writable_paths` as a tuple (checked: `ConfigError` naming the variable)."""
        return writable_paths(self.job_writable_paths, f"{ENV_PREFIX}NODE_JOB_WRITABLE_PATHS")

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


#: How a model is asked for JSON, most enforced first (see `capabilities.model._client`).
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
    #: Sampling temperature of every call: 0 asks for the model's most likely answer.
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


def is_loopback(host: str) -> bool:
    """`host` (a name or address, IPv6 in brackets or not) is this host's loopback only."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name, or an unspecified address such as 0.0.0.0: not only this host
