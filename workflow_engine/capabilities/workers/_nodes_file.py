"""The worker nodes the ``nodes`` worker may use, read from ``WORKFLOW_ENGINE_NODES_FILE``.

The file is a YAML (or JSON, which YAML reads too) list; each node::

    - name: gpu-1                      # unique; what state records as the job's target
      url: http://10.0.0.5:9190        # its Worker API; /v1/worker/jobs:run is appended
      token_env: GPU1_TOKEN            # or token_file: /run/secrets/gpu-1 (exactly one)
      labels: [gpu, docker]            # or a map: {capabilities: [gpu], locality: eu-west}
      max_jobs: 4                      # jobs this engine sends it at once (default 8)

A label list is taken as it is; a map gives ``key=value`` for a scalar value and one
``key=item`` per item of a list value (``locality=eu-west``, ``capabilities=gpu``). A step's
``required_labels`` must all be among a node's labels for the node to run it.

An ``http://`` URL whose host is not this host's loopback (``localhost``, 127.0.0.0/8, ``::1``;
a name is not resolved) would carry the node's token and every job in clear, so it is refused
unless ``WORKFLOW_ENGINE_NODES_ALLOW_PLAINTEXT_REMOTE`` says the network is trusted; an
``https://`` node's certificate is checked against the default CAs, or against
``WORKFLOW_ENGINE_NODES_CA_FILE`` (`_http`).

Read once when the engine starts; anything wrong stops the start with a message naming the
node and the field. A token comes from the environment variable or the file named, never from
the nodes file itself (which may then be shared); it is kept out of every repr and log.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from workflow_engine import _secret_files as secret_files
from workflow_engine.config import ENV_PREFIX, is_loopback
from workflow_engine.errors import NodesFileError

DEFAULT_MAX_JOBS = 8
MAX_NODES = 1000
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_FIELDS = frozenset({"name", "url", "token_env", "token_file", "labels", "max_jobs"})


@dataclass(frozen=True, slots=True)
class WorkerNode:
    """One worker node: where its Worker API is, how to authenticate, what it offers."""

    name: str
    #: Its base URL, without a trailing slash.
    url: str
    token: str = field(repr=False)
    labels: frozenset[str] = frozenset()
    max_jobs: int = DEFAULT_MAX_JOBS


def load_nodes_file(
    path: Path, environ: Mapping[str, str], *, allow_plaintext_remote: bool = False
) -> tuple[WorkerNode, ...]:
    """The nodes `path` lists; tokens from `environ` or from the files named (relative to it).
    `allow_plaintext_remote`: accept ``http://`` URLs beyond loopback (see the module doc)."""
    where = f"WORKFLOW_ENGINE_NODES_FILE {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise NodesFileError(f"{where}: cannot read it: {exc.strerror or exc}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise NodesFileError(f"{where}: not valid {_format(path)}: {exc}") from None
    return parse_nodes(
        data,
        environ,
        base_dir=path.parent,
        where=where,
        allow_plaintext_remote=allow_plaintext_remote,
    )


def parse_nodes(
    data: Any,
    environ: Mapping[str, str],
    *,
    base_dir: Path,
    where: str,
    allow_plaintext_remote: bool = False,
) -> tuple[WorkerNode, ...]:
    """`data` (the file's parsed content) as nodes; `where` prefixes every error."""
    if not isinstance(data, list) or not data:
        raise NodesFileError(f"{where}: must be a non-empty list of nodes")
    if len(data) > MAX_NODES:
        raise NodesFileError(f"{where}: more than {MAX_NODES} nodes")
    nodes: list[WorkerNode] = []
    seen: set[str] = set()
    for i, entry in enumerate(data):
        node = _node(entry, environ, base_dir, f"{where}: nodes[{i}]", allow_plaintext_remote)
        if node.name in seen:
            raise NodesFileError(f"{where}: nodes[{i}] ({node.name!r}).name: duplicate name")
        seen.add(node.name)
        nodes.append(node)
    return tuple(nodes)


def _node(
    entry: Any, environ: Mapping[str, str], base_dir: Path, at: str, allow_plaintext_remote: bool
) -> WorkerNode:
    if not isinstance(entry, dict):
        raise NodesFileError(f"{at}: must be a mapping with name, url, token_env or token_file")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise NodesFileError(
            f"{at}.name: required, 1-64 letters, digits, '.', '_' or '-', starting alnum"
        )
    at = f"{at} ({name!r})"
    unknown = sorted(str(key) for key in entry if key not in _FIELDS)
    if unknown:
        raise NodesFileError(
            f"{at}.{unknown[0]}: unknown field; expected {', '.join(sorted(_FIELDS))}"
        )
    url = base_url(entry.get("url"), f"{at}.url")
    refused = plaintext_refusal(url, allowed=allow_plaintext_remote)
    if refused:
        raise NodesFileError(f"{at}.url: {refused}")
    return WorkerNode(
        name=name,
        url=url,
        token=_token(entry, environ, base_dir, at),
        labels=_labels(entry.get("labels"), f"{at}.labels"),
        max_jobs=_max_jobs(entry.get("max_jobs", DEFAULT_MAX_JOBS), f"{at}.max_jobs"),
    )


def base_url(value: Any, at: str) -> str:
    """`value` checked as a node's Worker API base URL, without a trailing slash; raises
    `NodesFileError` prefixed with `at` when it is not one."""
    if not isinstance(value, str) or not value:
        raise NodesFileError(f"{at}: required, e.g. http://10.0.0.5:9190")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NodesFileError(f"{at}: must be an http:// or https:// URL with a host: {value!r}")
    if parts.query or parts.fragment:
        raise NodesFileError(f"{at}: must have no query or fragment: {value!r}")
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError:
        raise NodesFileError(f"{at}: invalid port: {value!r}") from None
    return value.rstrip("/")


def plaintext_refusal(url: str, *, allowed: bool) -> str | None:
    """Why `url` (a checked `base_url`) may not be used: plaintext HTTP to a host other than
    this one, unless `allowed`; None when it may."""
    parts = urlsplit(url)
    if allowed or parts.scheme != "http" or is_loopback(parts.hostname or ""):
        return None
    return (
        f"{url} is plaintext HTTP to another host: the node's bearer token and every job would "
        f"cross the network in clear. Use https:// (a private CA: {ENV_PREFIX}NODES_CA_FILE), "
        f"a loopback address, or set {ENV_PREFIX}NODES_ALLOW_PLAINTEXT_REMOTE=true if the "
        "network between the engine and its nodes is trusted with that"
    )


def _token(entry: Mapping[str, Any], environ: Mapping[str, str], base_dir: Path, at: str) -> str:
    token_env, token_file = entry.get("token_env"), entry.get("token_file")
    if (token_env is None) == (token_file is None):
        raise NodesFileError(f"{at}.token_env: exactly one of token_env and token_file is required")
    if token_env is not None:
        if not isinstance(token_env, str) or not token_env:
            raise NodesFileError(f"{at}.token_env: must name an environment variable")
        token = environ.get(token_env, "")
        if not token.strip():
            raise NodesFileError(f"{at}.token_env: variable {token_env} is not set or empty")
        return token.strip()
    if not isinstance(token_file, str) or not token_file:
        raise NodesFileError(f"{at}.token_file: must name a file")
    path = base_dir / token_file  # an absolute token_file stays as it is
    token, mode = secret_files.read_stripped(f"{at}.token_file", path, NodesFileError)
    if not token:
        raise NodesFileError(f"{at}.token_file: {path} is empty")
    problem = secret_files.exposed(f"{at}.token_file ({path})", path, mode, holds="its token")
    if problem:
        raise NodesFileError(problem)
    return token


def _labels(value: Any, at: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, list):
        return frozenset(_label(item, f"{at}[{k}]") for k, item in enumerate(value))
    if isinstance(value, dict):
        labels: set[str] = set()
        for key, item in value.items():
            if isinstance(item, list):
                labels.update(
                    f"{key}={_label(one, f'{at}.{key}[{k}]')}" for k, one in enumerate(item)
                )
            else:
                labels.add(f"{key}={_label(item, f'{at}.{key}')}")
        return frozenset(labels)
    raise NodesFileError(f"{at}: must be a list of labels or a map of them")


def _label(value: Any, at: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise NodesFileError(f"{at}: must be a string")
    text = str(value).strip()
    if not text:
        raise NodesFileError(f"{at}: must not be empty")
    return text


def _max_jobs(value: Any, at: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise NodesFileError(f"{at}: must be a whole number from 1 to 100000, got {value!r}")
    return value


def _format(path: Path) -> str:
    return "JSON" if path.suffix == ".json" else "YAML"
