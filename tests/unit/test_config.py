"""Settings come from WORKFLOW_ENGINE_* variables, typed, and flags override them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workflow_engine.cli import _parser, settings_from_args
from workflow_engine.config import env_names, settings_from_env
from workflow_engine.errors import ConfigError


def test_env_is_parsed_by_field_type() -> None:
    s = settings_from_env(
        {
            "WORKFLOW_ENGINE_LISTEN": "0.0.0.0:6000",
            "WORKFLOW_ENGINE_LEASE_TTL_SECONDS": "12",
            "WORKFLOW_ENGINE_DATA_DIR": "/var/lib/we",
            "WORKFLOW_ENGINE_DRAIN_TIMEOUT_SECONDS": "2.5",
            "UNRELATED": "x",
        }
    )
    assert (s.listen, s.lease_ttl_seconds, s.data_dir, s.drain_timeout_seconds) == (
        "0.0.0.0:6000",
        12,
        Path("/var/lib/we"),
        2.5,
    )
    assert s.database_url == ""  # embedded by default


def test_bad_number_names_the_variable() -> None:
    with pytest.raises(ValueError, match="WORKFLOW_ENGINE_LEASE_TTL_SECONDS"):
        settings_from_env({"WORKFLOW_ENGINE_LEASE_TTL_SECONDS": "soon"})


def test_flags_override_env() -> None:
    base = settings_from_env(
        {"WORKFLOW_ENGINE_LISTEN": "1.2.3.4:1", "WORKFLOW_ENGINE_HOLDER_ID": "env"}
    )
    args = _parser().parse_args(["serve", "--listen", "127.0.0.1:7"])
    s = settings_from_args(args, base)
    assert s.listen == "127.0.0.1:7" and s.holder_id == "env"


def test_pooler_settings() -> None:
    s = settings_from_env(
        {
            "WORKFLOW_ENGINE_DATABASE_PREPARE": "off",
            "WORKFLOW_ENGINE_LISTEN_DATABASE_URL": "postgresql://direct/db",
            "WORKFLOW_ENGINE_WATCH_POLL_SECONDS": "0.2",
        }
    )
    assert s.prepare_threshold is None
    assert s.listen_url("postgresql://pooler/db") == "postgresql://direct/db"
    assert s.watch_poll_seconds == 0.2
    default = settings_from_env({})
    assert default.prepare_threshold == 5  # psycopg's own default
    assert default.listen_url("postgresql://db") == "postgresql://db"
    off = settings_from_env({"WORKFLOW_ENGINE_LISTEN_DATABASE_URL": "none"})
    assert off.listen_url("postgresql://db") is None


@pytest.mark.parametrize(
    ("name", "value"),
    [("DATABASE_PREPARE", "sometimes"), ("WATCH_POLL_SECONDS", "0"), ("WATCH_POLL_SECONDS", "-1")],
)
def test_bad_pooler_settings_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"WORKFLOW_ENGINE_{name}"):
        settings_from_env({f"WORKFLOW_ENGINE_{name}": value})


def test_a_removed_setting_left_in_a_deployment_is_ignored() -> None:
    # WORKFLOW_ENGINE_COMPRESSOR chose among one implementation ("truncate", the only value it
    # took) and is gone: a deployment that still sets it starts as before.
    assert "WORKFLOW_ENGINE_COMPRESSOR" not in env_names()
    same = {"WORKFLOW_ENGINE_HOLDER_ID": "h"}  # else each call draws its own
    assert settings_from_env({**same, "WORKFLOW_ENGINE_COMPRESSOR": "truncate"}) == (
        settings_from_env(same)
    )


def test_a_capability_section_reads_its_own_prefixed_variables() -> None:
    settings = settings_from_env(
        {"WORKFLOW_ENGINE_JOB_TIMEOUT_SECONDS": "60", "WORKFLOW_ENGINE_JOB_OUTPUT_BYTES": "10"}
    )
    assert (settings.job.timeout_seconds, settings.job.output_bytes) == (60, 10)
    assert settings_from_env({}).job.timeout_seconds == 3600
    assert "WORKFLOW_ENGINE_JOB_TIMEOUT_SECONDS" in env_names()
    with pytest.raises(ValueError, match=r"^WORKFLOW_ENGINE_JOB_OUTPUT_BYTES: expected int"):
        settings_from_env({"WORKFLOW_ENGINE_JOB_OUTPUT_BYTES": "lots"})


def test_job_limits_and_user_ids_come_from_the_engines_and_the_nodes_own_variables() -> None:
    settings = settings_from_env(
        {
            "WORKFLOW_ENGINE_JOB_LIMITS_MEMORY_MB": "256",
            "WORKFLOW_ENGINE_JOB_UID_BASE": "3000000000",
            "WORKFLOW_ENGINE_NODE_LIMITS_PROCESSES": "0",
            "WORKFLOW_ENGINE_NODE_JOB_UID_COUNT": "100",
        }
    )
    assert (settings.job.limits.memory_mb, settings.job.limits.processes) == (256, 512)
    assert (settings.job.uid_base, settings.node.job_uid_count) == (3_000_000_000, 100)
    assert (settings.node.limits.processes, settings.node.limits.memory_mb) == (0, 8192)
    for name in ("JOB_LIMITS_MEMORY_MB", "NODE_LIMITS_CPU_SECONDS"):
        with pytest.raises(ValueError, match=rf"^WORKFLOW_ENGINE_{name}: expected 0 \(none\) to"):
            settings_from_env({f"WORKFLOW_ENGINE_{name}": "-1"})


@pytest.mark.parametrize("listen", ["9464", ":9464", "localhost:", "localhost:http"])
def test_a_metrics_address_without_host_and_port_is_refused(listen: str) -> None:
    assert settings_from_env({}).metrics_listen == ""  # off unless asked for
    assert settings_from_env({"WORKFLOW_ENGINE_METRICS_LISTEN": "0.0.0.0:9464"}).metrics_listen
    with pytest.raises(ValueError, match=r"^WORKFLOW_ENGINE_METRICS_LISTEN: expected HOST:PORT"):
        settings_from_env({"WORKFLOW_ENGINE_METRICS_LISTEN": listen})


def test_the_mcp_section_reads_its_variables_and_keeps_the_token_out_of_its_repr() -> None:
    settings = settings_from_env(
        {
            "WORKFLOW_ENGINE_TASK_SOURCE": "mcp",
            "WORKFLOW_ENGINE_MCP_URL": "http://orchestrator:8083/mcp",
            "WORKFLOW_ENGINE_MCP_TASK_TOOL": "task.get",
            "WORKFLOW_ENGINE_MCP_PREFERENCES_TOOL": "preference.effective",
            "WORKFLOW_ENGINE_MCP_TIMEOUT_SECONDS": "2.5",
            "WORKFLOW_ENGINE_MCP_BEARER_TOKEN": "s3cret",
        }
    )
    mcp = settings.mcp
    assert (mcp.url, mcp.task_tool, mcp.preferences_tool, mcp.timeout_seconds) == (
        "http://orchestrator:8083/mcp",
        "task.get",
        "preference.effective",
        2.5,
    )
    assert mcp.bearer_token == "s3cret" and "s3cret" not in repr(settings)
    defaults = settings_from_env({}).mcp
    assert (defaults.task_tool, defaults.preferences_tool) == (
        "db.task.get",
        "db.preference.effective",
    )


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"WORKFLOW_ENGINE_TASK_SOURCE": "mcp"}, "WORKFLOW_ENGINE_MCP_URL: required"),
        ({"WORKFLOW_ENGINE_MCP_TIMEOUT_SECONDS": "0"}, "WORKFLOW_ENGINE_MCP_TIMEOUT_SECONDS"),
    ],
)
def test_an_unusable_mcp_setting_is_refused_naming_it(env: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        settings_from_env(env)


def test_worker_node_settings_from_env_and_flags() -> None:
    base = settings_from_env(
        {
            "WORKFLOW_ENGINE_NODE_TOKEN": "s3cret",
            "WORKFLOW_ENGINE_NODE_MAX_TIMEOUT_SECONDS": "600",
            "WORKFLOW_ENGINE_NODE_LISTEN": "0.0.0.0:9000",
        }
    )
    assert "s3cret" not in repr(base)
    args = _parser().parse_args(
        ["worker-node", "--listen", "127.0.0.1:0", "--data-dir", "/n", "--max-body-bytes", "9"]
    )
    node = settings_from_args(args, base).node
    assert (node.listen, node.data_dir, node.max_body_bytes) == ("127.0.0.1:0", Path("/n"), 9)
    assert (node.token, node.max_timeout_seconds) == ("s3cret", 600)
    assert settings_from_args(args, base).listen == base.listen  # the engine's own: untouched


def test_worker_node_refuses_a_bad_cap_or_no_token() -> None:
    with pytest.raises(ValueError, match="WORKFLOW_ENGINE_NODE_MAX_TIMEOUT_SECONDS"):
        settings_from_env({"WORKFLOW_ENGINE_NODE_MAX_TIMEOUT_SECONDS": "10801"})
    args = _parser().parse_args(["worker-node"])
    with pytest.raises(ValueError, match="WORKFLOW_ENGINE_NODE_TOKEN: required"):
        settings_from_args(args, settings_from_env({}))
    assert settings_from_args(_parser().parse_args(["serve"]), settings_from_env({}))


def test_worker_node_tls_settings_and_where_plaintext_is_refused() -> None:
    env = {
        "WORKFLOW_ENGINE_NODE_TLS_CERT_FILE": "/tls/node.crt",
        "WORKFLOW_ENGINE_NODE_TLS_KEY_FILE": "/tls/node.key",
        "WORKFLOW_ENGINE_NODE_LISTEN": "0.0.0.0:8090",
    }
    node = settings_from_env(env).node
    assert (node.tls_cert_file, node.tls_key_file) == ("/tls/node.crt", "/tls/node.key")
    node.check_exposure()  # TLS: any address
    args = _parser().parse_args(["worker-node", "--tls-cert-file", "/c", "--tls-key-file", "/k"])
    flagged = settings_from_args(args, settings_from_env({"WORKFLOW_ENGINE_NODE_TOKEN": "t"}))
    assert (flagged.node.tls_cert_file, flagged.node.tls_key_file) == ("/c", "/k")
    with pytest.raises(ValueError, match=r"NODE_TLS_CERT_FILE and .*NODE_TLS_KEY_FILE: give both"):
        settings_from_env({"WORKFLOW_ENGINE_NODE_TLS_CERT_FILE": "/tls/node.crt"})
    for listen in ("127.0.0.1:8090", "127.0.0.2:0", "localhost:8090", "[::1]:8090"):
        settings_from_env({"WORKFLOW_ENGINE_NODE_LISTEN": listen}).node.check_exposure()
    for listen in ("0.0.0.0:8090", ":8090", "[::]:8090", "10.0.0.5:8090", "node-1:8090"):
        plain = settings_from_env({"WORKFLOW_ENGINE_NODE_LISTEN": listen})
        with pytest.raises(ValueError, match="WORKFLOW_ENGINE_NODE_ALLOW_PLAINTEXT_REMOTE=true"):
            plain.node.check_exposure()
        allowed = {"WORKFLOW_ENGINE_NODE_LISTEN": listen}
        allowed["WORKFLOW_ENGINE_NODE_ALLOW_PLAINTEXT_REMOTE"] = "true"
        settings_from_env(allowed).node.check_exposure()


def test_the_nodes_worker_settings() -> None:
    s = settings_from_env(
        {
            "WORKFLOW_ENGINE_WORKER": "nodes",
            "WORKFLOW_ENGINE_NODES_FILE": "/etc/workflow-engine/nodes.yaml",
            "WORKFLOW_ENGINE_NODES_HEALTH_INTERVAL_SECONDS": "2",
            "WORKFLOW_ENGINE_NODES_WAIT_SECONDS": "10",
            "WORKFLOW_ENGINE_NODES_RETRY_SECONDS": "60",
        }
    )
    assert (s.worker, s.nodes.file) == ("nodes", "/etc/workflow-engine/nodes.yaml")
    assert (s.nodes.health_interval_seconds, s.nodes.wait_seconds) == (2.0, 10.0)
    assert s.nodes.retry_seconds == 60.0
    assert (s.nodes.effective_source, s.nodes.refresh_seconds) == ("file", 30.0)
    assert (s.nodes.ca_file, s.nodes.allow_plaintext_remote) == ("", False)
    trusting = settings_from_env(
        {
            "WORKFLOW_ENGINE_NODES_CA_FILE": "/tls/ca.crt",
            "WORKFLOW_ENGINE_NODES_ALLOW_PLAINTEXT_REMOTE": "true",
        }
    )
    assert (trusting.nodes.ca_file, trusting.nodes.allow_plaintext_remote) == ("/tls/ca.crt", True)
    with pytest.raises(ValueError, match="WORKFLOW_ENGINE_NODES_HEALTH_INTERVAL_SECONDS"):
        settings_from_env({"WORKFLOW_ENGINE_NODES_HEALTH_INTERVAL_SECONDS": "0"})


def test_without_a_nodes_file_the_nodes_come_from_the_orchestrators_table() -> None:
    s = settings_from_env(
        {"WORKFLOW_ENGINE_WORKER": "nodes", "WORKFLOW_ENGINE_NODES_REFRESH_SECONDS": "5"}
    )
    assert (s.nodes.effective_source, s.nodes.refresh_seconds) == ("orchestrator", 5.0)
    explicit = {"WORKFLOW_ENGINE_WORKER": "nodes", "WORKFLOW_ENGINE_NODES_SOURCE": "orchestrator"}
    assert settings_from_env(explicit).nodes.effective_source == "orchestrator"
    with pytest.raises(ValueError, match="WORKFLOW_ENGINE_NODES_FILE: required when"):
        settings_from_env({"WORKFLOW_ENGINE_NODES_SOURCE": "file"})
    with pytest.raises(ValueError, match="set only one of them"):
        settings_from_env({**explicit, "WORKFLOW_ENGINE_NODES_FILE": "nodes.yaml"})
    with pytest.raises(ValueError, match="WORKFLOW_ENGINE_NODES_SOURCE: expected file or"):
        settings_from_env({"WORKFLOW_ENGINE_NODES_SOURCE": "table"})
    with pytest.raises(ValueError, match="WORKFLOW_ENGINE_NODES_REFRESH_SECONDS"):
        settings_from_env({"WORKFLOW_ENGINE_NODES_REFRESH_SECONDS": "0"})


def test_llm_settings_come_from_their_variables_and_the_key_is_never_shown() -> None:
    s = settings_from_env(
        {
            "WORKFLOW_ENGINE_PLANNER": "llm",
            "WORKFLOW_ENGINE_VERIFIER": "llm",
            "WORKFLOW_ENGINE_LLM_BASE_URL": "http://127.0.0.1:8000/v1",
            "WORKFLOW_ENGINE_LLM_MODEL": "qwen",
            "WORKFLOW_ENGINE_LLM_API_KEY": "sk-secret",
            "WORKFLOW_ENGINE_LLM_TIMEOUT_SECONDS": "12.5",
            "WORKFLOW_ENGINE_LLM_REVISE": "false",
            "WORKFLOW_ENGINE_COMMAND_POLICY_FILE": "/etc/we/policy.yaml",
        }
    )
    assert (s.llm.base_url, s.llm.model, s.llm.timeout_seconds, s.llm.revise) == (
        "http://127.0.0.1:8000/v1",
        "qwen",
        12.5,
        False,
    )
    assert s.command_policy_file == "/etc/we/policy.yaml"
    assert "sk-secret" not in repr(s)
    assert {"WORKFLOW_ENGINE_LLM_API_KEY", "WORKFLOW_ENGINE_LLM_API_KEY_FILE"} <= env_names()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({}, "WORKFLOW_ENGINE_LLM_BASE_URL: required"),
        ({"WORKFLOW_ENGINE_LLM_BASE_URL": "127.0.0.1:8000"}, "WORKFLOW_ENGINE_LLM_BASE_URL"),
        ({"WORKFLOW_ENGINE_LLM_BASE_URL": "http://h/v1"}, "WORKFLOW_ENGINE_LLM_MODEL: required"),
        (
            {
                "WORKFLOW_ENGINE_LLM_BASE_URL": "http://h/v1",
                "WORKFLOW_ENGINE_LLM_MODEL": "m",
                "WORKFLOW_ENGINE_LLM_RETRIES": "-1",
            },
            "WORKFLOW_ENGINE_LLM_RETRIES",
        ),
    ],
)
def test_an_llm_planner_without_a_usable_model_names_the_variable(
    env: dict[str, str], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        settings_from_env({"WORKFLOW_ENGINE_PLANNER": "llm", **env})


def test_no_model_configured_keeps_the_embedded_defaults() -> None:
    s = settings_from_env({})
    assert (s.planner, s.verifier, s.llm.base_url) == ("static", "checks", "")


def test_job_directories_are_kept_a_week_unless_told_otherwise() -> None:
    default = settings_from_env({})
    assert default.job.retention_seconds == default.node.job_retention_seconds == 7 * 24 * 3600
    s = settings_from_env(
        {
            "WORKFLOW_ENGINE_JOB_RETENTION_SECONDS": "0",
            "WORKFLOW_ENGINE_NODE_JOB_RETENTION_SECONDS": "86400",
        }
    )
    assert (s.job.retention_seconds, s.node.job_retention_seconds) == (0, 86400)
    for name in ("JOB_RETENTION_SECONDS", "NODE_JOB_RETENTION_SECONDS"):
        for bad in ("-1", "nan", "inf"):
            with pytest.raises(ValueError, match=rf"^WORKFLOW_ENGINE_{name}: expected 0 \(keep\)"):
                settings_from_env({f"WORKFLOW_ENGINE_{name}": bad})


def test_finished_workflows_are_pruned_after_30_days_rows_kept_unless_told_otherwise() -> None:
    default = settings_from_env({}).retention
    assert (default.days, default.delete_rows) == (30, False)
    s = settings_from_env(
        {"WORKFLOW_ENGINE_RETENTION_DAYS": "0", "WORKFLOW_ENGINE_RETENTION_DELETE_ROWS": "true"}
    ).retention
    assert (s.days, s.delete_rows) == (0, True)
    for name, bad in (
        ("DAYS", "-1"),
        ("DAYS", "100000000000"),  # past PostgreSQL's intervals: every round would fail
        ("BATCH_SIZE", "0"),
        ("INTERVAL_SECONDS", "0"),
    ):
        with pytest.raises(ValueError, match=rf"^WORKFLOW_ENGINE_RETENTION_{name}: expected"):
            settings_from_env({f"WORKFLOW_ENGINE_RETENTION_{name}": bad})


def test_tenant_limits_are_settings_that_cap_nothing_by_default() -> None:
    default = settings_from_env({})
    assert default.max_running_jobs == 64
    assert (
        default.max_running_jobs_per_tenant,
        default.max_running_workflows_per_tenant,
        default.max_watches_per_caller,
    ) == (0, 0, 0)
    s = settings_from_env(
        {
            "WORKFLOW_ENGINE_MAX_RUNNING_JOBS_PER_TENANT": "8",
            "WORKFLOW_ENGINE_MAX_RUNNING_WORKFLOWS_PER_TENANT": "100",
            "WORKFLOW_ENGINE_MAX_WATCHES_PER_CALLER": "50",
        }
    )
    assert (
        s.max_running_jobs_per_tenant,
        s.max_running_workflows_per_tenant,
        s.max_watches_per_caller,
    ) == (8, 100, 50)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("WORKFLOW_ENGINE_MAX_RUNNING_JOBS", "0"),
        ("WORKFLOW_ENGINE_MAX_RUNNING_JOBS_PER_TENANT", "-1"),
        ("WORKFLOW_ENGINE_MAX_RUNNING_WORKFLOWS_PER_TENANT", "-1"),
        ("WORKFLOW_ENGINE_MAX_WATCHES_PER_CALLER", str(2**31)),
    ],
)
def test_a_limit_out_of_range_names_its_variable(variable: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"^{variable}: expected"):
        settings_from_env({variable: value})


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("srv/cache", "is not an absolute, normalized directory"),
        ("/srv/../etc", "is not an absolute, normalized directory"),
        ("/", "is not an absolute, normalized directory"),
        ("/tmp/cache", "is beneath a job's own /tmp, /dev/shm, /run"),
        ("/srv/shared:/srv/shared/inner", "'/srv/shared/inner' is beneath '/srv/shared', also"),
    ],
)
def test_writable_paths_are_checked_naming_the_variable(value: str, says: str) -> None:
    for variable in (
        "WORKFLOW_ENGINE_JOB_WRITABLE_PATHS",
        "WORKFLOW_ENGINE_NODE_JOB_WRITABLE_PATHS",
    ):
        with pytest.raises(ConfigError, match=f"{variable}: .*{re.escape(says)}"):
            settings_from_env({variable: value})
    ok = settings_from_env({"WORKFLOW_ENGINE_JOB_WRITABLE_PATHS": "/srv/a:/srv/b"})
    assert ok.job.writable() == ("/srv/a", "/srv/b")
