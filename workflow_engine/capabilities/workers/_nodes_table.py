"""Worker nodes read from the orchestrator's ``nodes`` table and their capability snapshots.

The engine lends the read (`storage.orchestrator_nodes`: every row not soft-deleted, with its
latest ``node_capabilities.capability_snapshot`` by ``reported_at``); this module makes nodes
of the rows. A row gives:

- ``name``: ``node_slug``; ``url``: ``worker_api_target_url``; the token:
  ``worker_api_bearer_token`` (kept out of every repr and log).
- It is *usable*, as their dispatcher's ``ListDispatchableNodes`` has it, when its ``status`` is
  ``active`` (their other values: ``registered``, ``inactive``, ``drained``), its
  ``config_ack_status`` is ``applied`` (when the column exists), and it has a URL and a token;
  and, as for a nodes file, its URL is not plaintext ``http://`` beyond loopback unless
  ``WORKFLOW_ENGINE_NODES_ALLOW_PLAINTEXT_REMOTE`` is set (`nodes_file.plaintext_refusal`).
  Any other row is left out, with the reason, which a dispatch that finds no node repeats.
- Labels: the snapshot, read as a nodes file reads a label map, with dotted keys for nested
  maps (`snapshot_labels`): a string or number is ``key=value`` (``platform.arch=amd64``), a
  list gives ``key=item`` per item (``inference.available_models=qwen3:8b``; a list of maps
  is read item by item under the same key), ``true`` gives the key itself (``gpu.present``),
  ``false`` and null give nothing. The node's own ``node.labels`` are taken as they are, a
  section that is ``present`` or ``supported`` also gives ``capabilities=<section>``
  (``capabilities=gpu``), and each available model ``models=<model>``, as in a nodes file,
  so steps and preferences ask both kinds of node alike. Bookkeeping (``version``,
  ``reported_at``, ``node``, ``worker_api``, ``tls``, ``managed_services_status``) is skipped.
  The row's ``metadata.labels`` (a list, or a map as above) adds labels.
- ``max_jobs``: ``metadata.max_jobs``, else the snapshot's ``max_jobs``, else its
  ``sandbox.max_concurrency``, else the default (8).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from workflow_engine.capabilities.workers._nodes_file import (
    DEFAULT_MAX_JOBS,
    WorkerNode,
    base_url,
    plaintext_refusal,
)
from workflow_engine.config import ENV_PREFIX
from workflow_engine.domain.values import JsonObject
from workflow_engine.errors import NodesFileError, NodesTableMissing

WHERE = "the orchestrator's nodes table"
#: Their node status that takes jobs (`models.NodeStatusActive`).
USABLE_STATUS = "active"
#: Their ``config_ack_status`` once the node has applied its configuration (token included).
APPLIED = "applied"
#: Snapshot keys that describe the report, not the node.
SKIPPED_KEYS = frozenset(
    {"version", "reported_at", "node", "worker_api", "tls", "managed_services_status"}
)
#: Sections whose ``present`` / ``supported`` flag makes ``capabilities=<section>``.
_FLAGS = ("present", "supported")
MAX_LABELS = 1000
MAX_LABEL_CHARS = 200
_MAX_DEPTH = 8

MISSING_TABLE = (
    f"{ENV_PREFIX}WORKER is nodes but {ENV_PREFIX}NODES_FILE is not set, and the database has "
    "no orchestrator nodes table (nodes, node_capabilities) to read the nodes from: set "
    f"{ENV_PREFIX}NODES_FILE, or run against the orchestrator's database "
    f"({ENV_PREFIX}NODES_SOURCE=orchestrator)"
)


@dataclass(frozen=True, slots=True)
class NodeList:
    """The usable nodes, and the names of the others with why each is not usable."""

    nodes: tuple[WorkerNode, ...]
    unusable: Mapping[str, str] = field(default_factory=dict)


class NodeTable:
    """The orchestrator's nodes table as a source of worker nodes, read on each `load`."""

    where = WHERE

    def __init__(
        self,
        read_rows: Callable[[], Awaitable[list[JsonObject] | None]],
        *,
        allow_plaintext_remote: bool = False,
    ) -> None:
        self._read_rows = read_rows
        self._allow_plaintext_remote = allow_plaintext_remote

    async def load(self) -> NodeList:
        """The nodes as the table has them now; raises `NodesTableMissing` without it."""
        rows = await self._read_rows()
        if rows is None:
            raise NodesTableMissing(MISSING_TABLE)
        return nodes_from_rows(rows, allow_plaintext_remote=self._allow_plaintext_remote)


def nodes_from_rows(rows: list[JsonObject], *, allow_plaintext_remote: bool = False) -> NodeList:
    """The rows (`storage.orchestrator_nodes.read_nodes`) as usable nodes and the others."""
    nodes: list[WorkerNode] = []
    unusable: dict[str, str] = {}
    for row in rows:
        name = str(row.get("node_slug") or "").strip()
        if not name:
            continue  # nothing to name it by, in a finding or in a job's recorded target
        node = node_from_row(name, row, allow_plaintext_remote=allow_plaintext_remote)
        if isinstance(node, str):
            unusable[name] = node
        else:
            nodes.append(node)
    return NodeList(tuple(nodes), unusable)


def node_from_row(
    name: str, row: JsonObject, *, allow_plaintext_remote: bool = False
) -> WorkerNode | str:
    """The node a row describes, or why it is not usable."""
    status = row.get("status")
    if status != USABLE_STATUS:
        return f"status {status!r} in {WHERE}"
    ack = row.get("config_ack_status", APPLIED)  # a schema without the column: not asked
    if ack != APPLIED:
        return f"its configuration is not applied (config_ack_status {ack!r})"
    url, token = row.get("worker_api_target_url"), row.get("worker_api_bearer_token")
    if not isinstance(url, str) or not url.strip():
        return "no worker_api_target_url"
    if not isinstance(token, str) or not token.strip():
        return "no worker_api_bearer_token"
    try:
        checked = base_url(url.strip(), "worker_api_target_url")
    except NodesFileError as exc:
        return str(exc)
    refused = plaintext_refusal(checked, allowed=allow_plaintext_remote)
    if refused:
        return f"worker_api_target_url: {refused}"
    snapshot = _json(row.get("capability_snapshot"))
    metadata = _json(row.get("metadata"))
    labels = snapshot_labels(snapshot) | _metadata_labels(metadata)
    return WorkerNode(
        name=name,
        url=checked,
        token=token.strip(),
        labels=labels,
        max_jobs=_max_jobs(metadata, snapshot),
    )


def snapshot_labels(snapshot: Any) -> frozenset[str]:
    """A capability snapshot's labels; see the module docstring for the mapping."""
    if not isinstance(snapshot, dict):
        return frozenset()
    labels: set[str] = set()
    own = snapshot.get("node")
    if isinstance(own, dict) and isinstance(own.get("labels"), list):
        labels.update(str(item).strip() for item in own["labels"] if _scalar(item))
    for key, value in snapshot.items():
        if key in SKIPPED_KEYS:
            continue
        labels.update(_flatten(str(key), value, 0))
        if isinstance(value, dict) and any(value.get(flag) is True for flag in _FLAGS):
            labels.add(f"capabilities={key}")
    inference = snapshot.get("inference")
    if isinstance(inference, dict) and isinstance(inference.get("available_models"), list):
        labels.update(f"models={m}" for m in inference["available_models"] if _scalar(m))
    return _bounded(labels)


def _metadata_labels(metadata: Any) -> frozenset[str]:
    if not isinstance(metadata, dict):
        return frozenset()
    value = metadata.get("labels")
    if isinstance(value, list):
        return _bounded({str(item).strip() for item in value if _scalar(item)})
    if isinstance(value, dict):
        return _bounded({label for k, v in value.items() for label in _flatten(str(k), v, 0)})
    return frozenset()


def _flatten(key: str, value: Any, depth: int) -> Iterator[str]:
    if depth > _MAX_DEPTH:
        return
    if value is True:
        yield key
    elif _scalar(value):
        text = str(value).strip()
        if text:
            yield f"{key}={text}"
    elif isinstance(value, dict):
        for sub, item in value.items():
            yield from _flatten(f"{key}.{sub}", item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _flatten(key, item, depth + 1)


def _scalar(value: Any) -> bool:
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def _bounded(labels: set[str]) -> frozenset[str]:
    kept = sorted(label for label in labels if label and len(label) <= MAX_LABEL_CHARS)
    return frozenset(kept[:MAX_LABELS])


def _max_jobs(metadata: Any, snapshot: Any) -> int:
    sandbox = snapshot.get("sandbox") if isinstance(snapshot, dict) else None
    places = ((metadata, "max_jobs"), (snapshot, "max_jobs"), (sandbox, "max_concurrency"))
    for source, key in places:
        value = source.get(key) if isinstance(source, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 100_000:
            return value
    return DEFAULT_MAX_JOBS


def _json(value: Any) -> Any:
    """A jsonb value; their ORM may have stored a JSON document as a JSON string."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value
