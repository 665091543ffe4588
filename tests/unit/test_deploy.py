"""The deployment files only set variables the engine reads, and probe what it serves."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from workflow_engine import __version__
from workflow_engine.config import ENV_PREFIX, env_names

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
#: The settings, and what the engine sets in every job's environment (a job may use those).
JOB_ENV = {f"{ENV_PREFIX}{n}" for n in ("TASK_ID", "JOB_ID", "ATTEMPT", "REMEDIATION", "CONTEXT")}
KNOWN = env_names() | JOB_ENV


def test_every_engine_variable_in_deploy_is_a_setting() -> None:
    used: set[str] = set()
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            used |= set(re.findall(rf"\b{ENV_PREFIX}[A-Z_]+\b", path.read_text()))
    assert used, "deploy/ sets no engine variables at all?"
    assert used <= KNOWN, f"unknown settings in deploy/: {sorted(used - KNOWN)}"


def test_compose_and_kubernetes_serve_tls_with_callers_and_probe_the_health_port() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert {"postgres", "engine-1", "engine-2"} <= set(compose["services"])
    for name in ("engine-1", "engine-2"):
        env = compose["services"][name]["environment"]
        files = {
            env[f"WORKFLOW_ENGINE_{k}"] for k in ("TLS_CERT_FILE", "TLS_KEY_FILE", "TOKENS_FILE")
        }
        assert files == {f"/run/secrets/{s}" for s in compose["services"][name]["secrets"]}
        assert all(p.startswith("127.0.0.1:") for p in compose["services"][name]["ports"])
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "workflow-engine.yaml").read_text()))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    health_port = int(env["WORKFLOW_ENGINE_HEALTH_LISTEN"].rsplit(":", 1)[1])
    assert container["readinessProbe"]["grpc"]["port"] == health_port
    assert container["livenessProbe"]["grpc"]["port"] == health_port
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    for key in ("TLS_CERT_FILE", "TLS_KEY_FILE", "TOKENS_FILE"):
        assert env[f"WORKFLOW_ENGINE_{key}"].rsplit("/", 1)[0] in mounts
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    secrets = {v["secret"]["secretName"] for v in volumes if "secret" in v}
    assert secrets == {"workflow-engine-tls", "workflow-engine-callers"}
    assert "EXPOSE 50051" in (DEPLOY / "Dockerfile").read_text()


def test_metrics_are_on_in_the_manifests_and_scraped_where_they_are_served() -> None:
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    for name in ("engine-1", "engine-2"):
        assert services[name]["environment"]["WORKFLOW_ENGINE_METRICS_LISTEN"] == "0.0.0.0:9464"
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "workflow-engine.yaml").read_text()))
    template = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]
    container = template["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    port = env["WORKFLOW_ENGINE_METRICS_LISTEN"].rsplit(":", 1)[1]
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert (
        annotations["prometheus.io/port"] == port
        and annotations["prometheus.io/path"] == "/metrics"
    )
    assert {"name": "metrics", "containerPort": int(port)} in container["ports"]


def test_every_container_that_runs_jobs_may_make_their_network_namespaces() -> None:
    # As the image's unprivileged user, jobwrap isolates each task's jobs in a new user namespace
    # with a network namespace in it, which the container runtimes' default seccomp profiles
    # forbid (docs/security.md, "What a job may do").
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    for name in ("engine-1", "engine-2", "worker-node-1"):
        assert services[name]["security_opt"] == ["seccomp=unconfined"], name
    for manifest in ("workflow-engine.yaml", "worker-node.yaml"):
        docs = yaml.safe_load_all((DEPLOY / "kubernetes" / manifest).read_text())
        workload = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))
        context = workload["spec"]["template"]["spec"]["containers"][0]["securityContext"]
        assert context["seccompProfile"] == {"type": "Unconfined"}, manifest
        assert context["runAsNonRoot"] and context["capabilities"] == {"drop": ["ALL"]}


def test_the_worker_node_is_deployed_with_its_probes_and_own_volume() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    node = compose["services"]["worker-node-1"]
    assert node["command"][0] == "worker-node" and "--data-dir" in node["command"]
    assert "WORKFLOW_ENGINE_NODE_TOKEN" in node["environment"]
    assert any("/readyz" in part for part in node["healthcheck"]["test"])
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "worker-node.yaml").read_text()))
    statefulset = next(d for d in docs if d["kind"] == "StatefulSet")
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "worker-node"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["data"] in container["args"]  # the data dir is the persistent volume
    assert "8090" in (DEPLOY / "Dockerfile").read_text()


def test_the_worker_node_serves_tls_from_a_secret_and_never_plaintext_beyond_loopback() -> None:
    """Finding 11 of issue 48: the node bound 0.0.0.0 in plaintext, its token in clear."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    node = compose["services"]["worker-node-1"]
    env = node["environment"]
    files = {env["WORKFLOW_ENGINE_NODE_TLS_CERT_FILE"], env["WORKFLOW_ENGINE_NODE_TLS_KEY_FILE"]}
    assert files == {f"/run/secrets/{name}" for name in ("node-tls.crt", "node-tls.key")}
    assert {"node-tls.crt", "node-tls.key"} <= set(node["secrets"]) <= set(compose["secrets"])
    assert "https://localhost:8090/readyz" in " ".join(node["healthcheck"]["test"])
    assert "WORKFLOW_ENGINE_NODE_ALLOW_PLAINTEXT_REMOTE" not in env
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "worker-node.yaml").read_text()))
    pod = next(d for d in docs if d["kind"] == "StatefulSet")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    for key in ("TLS_CERT_FILE", "TLS_KEY_FILE"):
        assert env[f"WORKFLOW_ENGINE_NODE_{key}"].rsplit("/", 1)[0] == mounts["tls"]
    assert secrets == {"tls": "worker-node-tls"}
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    assert "WORKFLOW_ENGINE_NODE_ALLOW_PLAINTEXT_REMOTE" not in env


def test_every_image_tag_and_the_dockerfiles_version_label_are_the_engines_version() -> None:
    tags = set()
    for path in DEPLOY.rglob("*.yaml"):
        tags |= set(re.findall(r"\bworkflow-engine:([\w.+-]+)", path.read_text()))
    assert tags == {__version__}, "deploy/ names the image by a version that is not the engine's"
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert re.findall(r"^ARG VERSION=(.*)$", dockerfile, re.MULTILINE) == [__version__]
    assert 'org.opencontainers.image.version="${VERSION}"' in dockerfile
    # image.sh reads it from the package, where the version is written.
    assert "__version__" in (DEPLOY / "image.sh").read_text()


def test_containers_are_built_once_reap_restart_and_say_when_they_are_healthy() -> None:
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    ours = ("engine-1", "engine-2", "worker-node-1")
    assert [name for name in ours if "build" in services[name]] == ["engine-1"]
    assert {services[name]["image"] for name in ours} == {f"workflow-engine:{__version__}"}
    for name in ours:
        assert services[name]["init"] is True and services[name]["restart"] == "unless-stopped"
    for name in ("engine-1", "engine-2"):
        probe = " ".join(services[name]["healthcheck"]["test"])
        health = services[name]["environment"]["WORKFLOW_ENGINE_HEALTH_LISTEN"]
        assert health in probe and "workflow_engine.v1.WorkflowEngine" in probe


def test_kubernetes_pods_get_no_api_token_a_read_only_root_and_disruption_budgets() -> None:
    for manifest, protocol in (("workflow-engine.yaml", "grpc"), ("worker-node.yaml", "https")):
        docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / manifest).read_text()))
        kinds = {d["kind"]: d for d in docs}
        pod = next(d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))["spec"]
        assert pod["template"]["spec"]["automountServiceAccountToken"] is False, manifest
        container = pod["template"]["spec"]["containers"][0]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, manifest
        assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}, manifest
        budget = kinds["PodDisruptionBudget"]["spec"]
        assert budget["selector"] == pod["selector"], manifest
        assert {p["appProtocol"] for p in kinds["Service"]["spec"]["ports"]} == {protocol}
    engine = next(
        d
        for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "workflow-engine.yaml").read_text())
        if d["kind"] == "Deployment"
    )
    container = engine["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["data"] == "/home/engine/data"  # the image's WORKFLOW_ENGINE_DATA_DIR
    assert "WORKFLOW_ENGINE_DATA_DIR=/home/engine/data" in (DEPLOY / "Dockerfile").read_text()
    readiness = container["readinessProbe"]["grpc"]
    assert readiness["service"] == "workflow_engine.v1.WorkflowEngine"
    assert "service" not in container["livenessProbe"]["grpc"]
