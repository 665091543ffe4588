"""The nodes file: nodes, their tokens and labels; anything wrong named by node and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workflow_engine.capabilities.workers._nodes_file import (
    DEFAULT_MAX_JOBS,
    WorkerNode,
    load_nodes_file,
)
from workflow_engine.errors import NodesFileError

YAML = """
- name: gpu-1
  url: http://10.0.0.5:9190/
  token_env: GPU1_TOKEN
  labels: {capabilities: [gpu, cuda], locality: eu-west, models: [llama3]}
  max_jobs: 2
- name: cpu-1
  url: https://cpu.example:8443
  token_file: secrets/cpu-1
  labels: [docker, "locality=us"]
"""


def write(tmp_path: Path, text: str, name: str = "nodes.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_yaml_file_with_both_token_sources_and_label_forms(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "cpu-1").write_text("file-token\n")
    (tmp_path / "secrets" / "cpu-1").chmod(0o600)  # a token is its owner's alone
    environ = {"GPU1_TOKEN": " env-token "}
    nodes = load_nodes_file(write(tmp_path, YAML), environ, allow_plaintext_remote=True)
    assert nodes == (
        WorkerNode(
            name="gpu-1",
            url="http://10.0.0.5:9190",
            token="env-token",
            labels=frozenset(
                {
                    "capabilities=gpu",
                    "capabilities=cuda",
                    "locality=eu-west",
                    "models=llama3",
                }
            ),
            max_jobs=2,
        ),
        WorkerNode(
            name="cpu-1",
            url="https://cpu.example:8443",
            token="file-token",
            labels=frozenset({"docker", "locality=us"}),
            max_jobs=DEFAULT_MAX_JOBS,
        ),
    )
    assert "env-token" not in repr(nodes)  # tokens stay out of logs


def test_a_json_file(tmp_path: Path) -> None:
    entry = {"name": "n", "url": "https://n:1", "token_env": "T"}
    (node,) = load_nodes_file(write(tmp_path, json.dumps([entry]), "nodes.json"), {"T": "t"})
    assert (node.name, node.token, node.labels) == ("n", "t", frozenset())


GOOD: dict[str, Any] = {"name": "n1", "url": "https://n1:9190", "token_env": "T"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"nodes": []}, "must be a non-empty list of nodes"),
        ([], "must be a non-empty list of nodes"),
        (["n1"], "nodes[0]: must be a mapping"),
        ([{**GOOD, "name": "bad name"}], "nodes[0].name: required"),
        ([GOOD, GOOD], "nodes[1] ('n1').name: duplicate name"),
        ([{**GOOD, "url": "n1:9190"}], "nodes[0] ('n1').url: must be an http:// or https://"),
        ([{**GOOD, "url": "http://n1:port"}], "nodes[0] ('n1').url: invalid port"),
        ([{k: v for k, v in GOOD.items() if k != "url"}], "nodes[0] ('n1').url: required"),
        ([{**GOOD, "token_file": "t"}], "('n1').token_env: exactly one of token_env and token_"),
        ([{**GOOD, "token_env": "UNSET"}], "('n1').token_env: variable UNSET is not set"),
        ([{**GOOD, "max_jobs": 0}], "nodes[0] ('n1').max_jobs: must be a whole number"),
        ([{**GOOD, "max_jobs": "4"}], "nodes[0] ('n1').max_jobs: must be a whole number"),
        ([{**GOOD, "labels": "gpu"}], "nodes[0] ('n1').labels: must be a list of labels or a map"),
        ([{**GOOD, "labels": ["gpu", ""]}], "nodes[0] ('n1').labels[1]: must not be empty"),
        ([{**GOOD, "labels": {"models": [None]}}], "('n1').labels.models[0]: must be a string"),
        ([{**GOOD, "max_job": 3}], "nodes[0] ('n1').max_job: unknown field"),
        (
            [{**GOOD, "url": "http://10.0.0.5:9190"}],
            "nodes[0] ('n1').url: http://10.0.0.5:9190 is plaintext HTTP to another host: the "
            "node's bearer token and every job would cross the network in clear. Use https:// "
            "(a private CA: WORKFLOW_ENGINE_NODES_CA_FILE), a loopback address, or set "
            "WORKFLOW_ENGINE_NODES_ALLOW_PLAINTEXT_REMOTE=true",
        ),
        ([{**GOOD, "url": "http://n1:9190"}], "('n1').url: http://n1:9190 is plaintext HTTP"),
        ([{**GOOD, "url": "http://0.0.0.0:9190"}], "('n1').url: http://0.0.0.0:9190 is plaintext"),
    ],
)
def test_a_bad_node_is_named_with_its_field(tmp_path: Path, content: Any, message: str) -> None:
    path = write(tmp_path, json.dumps(content), "nodes.json")
    with pytest.raises(NodesFileError) as err:
        load_nodes_file(path, {"T": "token"})
    assert message in str(err.value)
    assert str(err.value).startswith(f"WORKFLOW_ENGINE_NODES_FILE {path}: ")


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:9190", "http://127.0.0.2:1", "http://localhost:1", "http://[::1]:1"]
)
def test_plaintext_to_loopback_needs_no_trust(tmp_path: Path, url: str) -> None:
    path = write(tmp_path, json.dumps([{**GOOD, "url": url}]), "nodes.json")
    assert load_nodes_file(path, {"T": "token"})[0].url == url


def test_a_trusted_network_takes_plaintext_beyond_loopback(tmp_path: Path) -> None:
    path = write(tmp_path, json.dumps([{**GOOD, "url": "http://10.0.0.5:9190"}]), "nodes.json")
    (node,) = load_nodes_file(path, {"T": "token"}, allow_plaintext_remote=True)
    assert node.url == "http://10.0.0.5:9190"


def test_an_unreadable_file_or_token_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(NodesFileError, match="cannot read it"):
        load_nodes_file(tmp_path / "missing.yaml", {})
    with pytest.raises(NodesFileError, match="not valid YAML"):
        load_nodes_file(write(tmp_path, "- name: [unclosed"), {})
    entry = {**GOOD, "token_env": None, "token_file": "nope"}
    del entry["token_env"]
    with pytest.raises(NodesFileError, match=r"\('n1'\)\.token_file: cannot read"):
        load_nodes_file(write(tmp_path, json.dumps([entry]), "n.json"), {})
