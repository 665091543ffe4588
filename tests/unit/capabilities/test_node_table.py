"""Rows of the orchestrator's nodes table as worker nodes: usability, labels, max_jobs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from workflow_engine.capabilities.workers._nodes_file import DEFAULT_MAX_JOBS
from workflow_engine.capabilities.workers._nodes_table import (
    NodeTable,
    nodes_from_rows,
    snapshot_labels,
)
from workflow_engine.errors import NodesTableMissing

#: A capability snapshot as their node reports it (`nodepayloads.CapabilityReport`), trimmed.
THEIR_SNAPSHOT: dict[str, Any] = {
    "version": 1,
    "reported_at": "2026-03-01T10:00:00Z",
    "node": {"node_slug": "gpu-1", "labels": ["rack=r7", "spot"]},
    "platform": {"os": "linux", "arch": "amd64", "kernel_version": ""},
    "compute": {"cpu_cores": 16, "ram_mb": 65536},
    "gpu": {"present": True, "devices": [{"vendor": "nvidia", "vram_mb": 24576}]},
    "sandbox": {"supported": True, "features": ["netns"], "max_concurrency": 3},
    "inference": {"supported": False, "running": False, "available_models": ["qwen3:8b"]},
    "network": {"orchestrator_reachable": True},
    "worker_api": {"base_url": "http://10.0.0.5:9190"},
    "tls": {"trust_material_status": "ok"},
}


def row(slug: str = "gpu-1", **columns: Any) -> dict[str, Any]:
    """A row as `storage.orchestrator_nodes.read_nodes` returns it."""
    return {
        "id": "3f1c0f7e-0000-4000-8000-000000000001",
        "node_slug": slug,
        "status": "active",
        "config_ack_status": "applied",
        "worker_api_target_url": "https://10.0.0.5:9190/",
        "worker_api_bearer_token": "secret-token",
        "metadata": None,
        "capability_snapshot": None,
        **columns,
    }


def test_their_snapshot_maps_to_labels_as_a_nodes_file_label_map_would() -> None:
    assert snapshot_labels(THEIR_SNAPSHOT) == {
        # the node's own labels, as they are
        "rack=r7",
        "spot",
        # strings and numbers: key=value, with dotted keys; true: the key; false, "": nothing
        "platform.os=linux",
        "platform.arch=amd64",
        "compute.cpu_cores=16",
        "compute.ram_mb=65536",
        "gpu.present",
        "gpu.devices.vendor=nvidia",
        "gpu.devices.vram_mb=24576",
        "sandbox.supported",
        "sandbox.features=netns",
        "sandbox.max_concurrency=3",
        "inference.available_models=qwen3:8b",
        "network.orchestrator_reachable",
        # the nodes file's conventions: present / supported sections, available models
        "capabilities=gpu",
        "capabilities=sandbox",
        "models=qwen3:8b",
    }


def test_a_flat_snapshot_reads_exactly_as_the_same_map_in_a_nodes_file() -> None:
    snapshot = {"capabilities": ["gpu", "cuda"], "locality": "eu-west", "docker": True}
    assert snapshot_labels(snapshot) == {
        "capabilities=gpu",
        "capabilities=cuda",
        "locality=eu-west",
        "docker",
    }
    assert snapshot_labels(None) == frozenset() and snapshot_labels([1]) == frozenset()


def test_a_usable_row_becomes_a_node() -> None:
    metadata = {"labels": {"locality": "eu"}, "max_jobs": 2}
    listed = nodes_from_rows(
        [row(capability_snapshot=json.dumps({"gpu": True}), metadata=metadata)]
    )
    (node,) = listed.nodes
    assert (node.name, node.url, node.token) == ("gpu-1", "https://10.0.0.5:9190", "secret-token")
    assert node.labels == {"gpu", "locality=eu"} and node.max_jobs == 2
    assert "secret-token" not in repr(listed)


@pytest.mark.parametrize(
    ("metadata", "snapshot", "expected"),
    [
        (None, None, DEFAULT_MAX_JOBS),
        (None, THEIR_SNAPSHOT, 3),  # sandbox.max_concurrency
        (None, {**THEIR_SNAPSHOT, "max_jobs": 5}, 5),
        ({"max_jobs": 7}, THEIR_SNAPSHOT, 7),
        ({"max_jobs": 0}, {"max_jobs": True}, DEFAULT_MAX_JOBS),  # not a count: ignored
    ],
)
def test_max_jobs_from_metadata_then_snapshot_then_the_default(
    metadata: Any, snapshot: Any, expected: int
) -> None:
    (node,) = nodes_from_rows([row(metadata=metadata, capability_snapshot=snapshot)]).nodes
    assert node.max_jobs == expected


def test_rows_that_are_not_usable_are_left_out_with_the_reason() -> None:
    listed = nodes_from_rows(
        [
            row("a-active"),
            row("b-inactive", status="inactive"),
            row("c-registered", status="registered"),
            row("d-unacked", config_ack_status="pending"),
            row("e-no-url", worker_api_target_url=None),
            row("f-no-token", worker_api_bearer_token=""),
            row("g-bad-url", worker_api_target_url="ftp://x"),
            row("", status="active"),  # no slug: nothing to name it by
        ]
    )
    assert [n.name for n in listed.nodes] == ["a-active"]
    assert dict(listed.unusable) == {
        "b-inactive": "status 'inactive' in the orchestrator's nodes table",
        "c-registered": "status 'registered' in the orchestrator's nodes table",
        "d-unacked": "its configuration is not applied (config_ack_status 'pending')",
        "e-no-url": "no worker_api_target_url",
        "f-no-token": "no worker_api_bearer_token",
        "g-bad-url": "worker_api_target_url: must be an http:// or https:// URL with a host: "
        "'ftp://x'",
    }


def test_a_plaintext_url_beyond_loopback_is_not_usable_unless_the_network_is_trusted() -> None:
    rows = [
        row("remote", worker_api_target_url="http://10.0.0.5:9190"),
        row("named", worker_api_target_url="http://gpu-1.internal:9190"),  # not resolved
        row("local", worker_api_target_url="http://127.0.0.1:9190"),
        row("local6", worker_api_target_url="http://[::1]:9190"),
    ]
    listed = nodes_from_rows(rows)
    assert [n.name for n in listed.nodes] == ["local", "local6"]
    assert set(listed.unusable) == {"remote", "named"}
    assert listed.unusable["remote"].startswith(
        "worker_api_target_url: http://10.0.0.5:9190 is plaintext HTTP to another host"
    )
    assert "WORKFLOW_ENGINE_NODES_ALLOW_PLAINTEXT_REMOTE=true" in listed.unusable["remote"]
    trusted = nodes_from_rows(rows, allow_plaintext_remote=True)
    assert len(trusted.nodes) == 4 and not trusted.unusable


def test_a_schema_without_config_ack_status_does_not_ask_for_it() -> None:
    bare = row()
    del bare["config_ack_status"]
    assert [n.name for n in nodes_from_rows([bare]).nodes] == ["gpu-1"]


async def test_no_table_is_an_error_naming_both_settings() -> None:
    async def no_table() -> None:
        return None

    with pytest.raises(NodesTableMissing) as err:
        await NodeTable(no_table).load()
    assert "WORKFLOW_ENGINE_NODES_FILE" in str(err.value)
    assert "WORKFLOW_ENGINE_NODES_SOURCE=orchestrator" in str(err.value)
