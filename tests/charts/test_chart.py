"""The Helm chart, rendered and linted by the real Helm library, checked against the real schemas."""

from __future__ import annotations

import json
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from batchd.api.pod import labels
from batchd.api.spec import TracingSpec
from batchd.api.tracing_config import pod_environment
from batchd.operator.settings import Settings
from batchd.testing import ROOT
from batchd.testing.helm import CHART, SCENARIOS, only, render
from batchd.testing.schemas import KUBERNETES_VERSIONS

# Prometheus Operator kinds are CRD-typed: the Kubernetes schemas do not know them.
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor"}


def operator(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one object of `kind` that belongs to the operator (the router has its own)."""
    return only(
        [o for o in objects if o["metadata"]["labels"].get("app.kubernetes.io/component") == "operator"], kind
    )


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_chart_lints_clean_in_strict_mode(scenario: str) -> None:
    report = helm.lint(str(CHART), SCENARIOS[scenario], strict=True)
    assert report["errors"] == [] and report["messages"] == [], report


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_object_is_valid_kubernetes(scenario: str, version: str) -> None:
    objects = render(SCENARIOS[scenario])
    assert objects
    for manifest in objects:
        if manifest["kind"] in PROMETHEUS_OPERATOR_KINDS:
            assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(manifest, f"{version}.0", strict=True)


def test_defaults_install_cluster_wide_with_the_dockerfiles_images(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render()
    kinds = sorted(o["kind"] for o in objects)
    # The operator's and the router's own of each, the dashboard, and the router's disruption budget;
    # the router's binding for token and access reviews, and the role users bind their callers to
    # (`<release>-invoker`).
    assert kinds == sorted(
        ["ClusterRole", "ClusterRoleBinding", "Deployment", "Service", "ServiceAccount"] * 2
        + ["ConfigMap", "PodDisruptionBudget"]
        + ["ClusterRoleBinding", "ClusterRole"]
    )
    container = operator(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item["value"] for item in container["env"]}
    assert container["image"] == "ghcr.io/batchd/batchd-operator:0.1.0"
    assert env["BATCHD_REPLICA_IMAGE"] == Settings().replica_image == "ghcr.io/batchd/batchd-replica:0.1.0"
    assert env["BATCHD_NAMESPACES"] == ""
    # What the operator reads is what the chart sets, and a malformed value would fail its start.
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    settings = Settings.from_env()
    assert settings.metrics_port == 9090 and settings.liveness_endpoint.endswith(":8080/healthz")


def test_the_operator_pod_is_hardened_and_probed() -> None:
    pod = operator(render(), "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": 9090, "health": 8080}
    assert container["resources"]["limits"]["memory"]


def test_watching_listed_namespaces_grants_nothing_cluster_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(SCENARIOS["namespaced-values"])
    kinds = [o["kind"] for o in objects]
    # The one cluster-wide grant: the router's binding to Kubernetes' own system:auth-delegator,
    # since token and access reviews are cluster-scoped APIs. batchd defines no ClusterRole.
    assert "ClusterRole" not in kinds
    (cluster_binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert cluster_binding["roleRef"]["name"] == "system:auth-delegator"
    roles = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == "batchd"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = [o for o in objects if o["kind"] == "RoleBinding"]
    assert all(b["subjects"][0]["namespace"] == "batchd-system" for b in bindings)
    env = {
        e["name"]: e["value"]
        for e in operator(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    assert Settings.from_env().namespaces == ("team-a", "team-b")


def test_monitors_replace_scrape_annotations_and_select_the_replica_pods() -> None:
    plain = operator(render(), "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert plain["prometheus.io/scrape"] == "true" and plain["prometheus.io/port"] == "9090"

    objects = render(SCENARIOS["monitoring-values"])
    annotations = operator(objects, "Deployment")["spec"]["template"]["metadata"].get("annotations") or {}
    assert "prometheus.io/scrape" not in annotations
    service_monitor = operator(objects, "ServiceMonitor")
    service = operator(objects, "Service")
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service_monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    pod_monitor = only(objects, "PodMonitor")
    # The PodMonitor must select the pods the operator actually makes, on the port they expose.
    replica_labels = labels("minilm")
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= replica_labels.items()
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_the_dashboard_configmap_is_the_dashboard_file() -> None:
    objects = render(SCENARIOS["monitoring-values"])
    config_map = only(objects, "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "monitoring"
    shipped = json.loads(config_map["data"]["batchd.json"])
    assert shipped == json.loads((CHART / "dashboards" / "batchd.json").read_text())
    assert "ConfigMap" not in [o["kind"] for o in render(SCENARIOS["custom-values"])]


def test_custom_values_reach_the_operator() -> None:
    values = SCENARIOS["custom-values"]
    pod = operator(render(values), "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert container["image"] == "registry.example.com/ml/batchd-operator:0.1.0-rc1"
    assert env["BATCHD_REPLICA_IMAGE"] == "registry.example.com/ml/batchd-replica:0.1.0-rc1-cuda"
    assert env["BATCHD_MODEL_MIRROR"] == "/models/mirror"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["tolerations"] == values["tolerations"]


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"replicas": 2}, "replicas"),
        ({"metricsPort": "9090"}, "metricsPort"),
        ({"image": {"repository": "x", "pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"watchNamespaces": ["Team_A"]}, "watchNamespaces"),
        ({"monitoring": {"enabled": "yes"}}, "enabled"),
        ({"dashboards": {"enabled": True, "lables": {}}}, "lables"),
        ({"fullnameOverride": "x" * 64}, "fullnameOverride"),
        ({"healthPort": 0}, "healthPort"),
        ({"monitoring": {"interval": "soon"}}, "interval"),
        ({"serviceAccount": {"create": "true"}}, "create"),
        ({"router": {"replicas": 2}}, "replicas"),
        ({"router": {"replicaCount": 0}}, "replicaCount"),
        ({"router": {"hold": {"timeoutSeconds": 0}}}, "timeoutSeconds"),
        ({"router": {"hold": {"maxPerDeployment": "many"}}}, "maxPerDeployment"),
        ({"router": {"enabled": "yes"}}, "enabled"),
        ({"tracing": {"endpoint": "jaeger:4318"}}, "endpoint"),
        ({"tracing": {"endpoint": "http://jaeger:4318", "samplingRatio": 2}}, "samplingRatio"),
    ],
)
def test_the_values_schema_refuses_bad_values_naming_them(values: dict[str, Any], named: str) -> None:
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmError) as refused:
        chart.validate_schema(values)
    assert named in str(refused.value)


@pytest.mark.parametrize("component", ["operator", "router"])
def test_tracing_gives_the_operator_and_the_router_what_replica_pods_get(component: str) -> None:
    """The chart's OpenTelemetry environment is the one `batchd.api.tracing_config` renders for replica
    pods (the chart cannot import it: this test holds the two together)."""
    endpoint, ratio = "http://jaeger.observability:4318", 0.05
    objects = render({"tracing": {"endpoint": endpoint, "samplingRatio": ratio}})
    (deployment,) = [
        o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    rendered = [item for item in container["env"] if item["name"].startswith("OTEL_")]
    resource = {
        "k8s.deployment.name": deployment["metadata"]["name"],
        "k8s.container.name": container["name"],
        "service.version": yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"],
    }
    spec = TracingSpec(endpoint=endpoint, sampling_ratio=ratio)
    assert rendered == pod_environment(spec, f"batchd-{component}", resource)
    untraced = render()
    assert not [
        item
        for o in untraced
        if o["kind"] == "Deployment"
        for item in o["spec"]["template"]["spec"]["containers"][0]["env"]
        if item["name"].startswith("OTEL_")
    ]


def test_every_copy_of_the_crd_equals_the_one_in_crds() -> None:
    source = ROOT / "crds" / "batcheddeployments.serving.batchd.dev.yaml"
    copies = [
        path
        for path in ROOT.joinpath("charts").rglob("*.yaml")
        if "templates" not in path.parts and "kind: CustomResourceDefinition" in path.read_text()
    ]
    assert copies, "the chart ships no CRD"
    for copy in copies:
        assert copy.read_text() == source.read_text(), f"{copy} differs from {source}: copy it again"
    assert helm.Chart.load(str(CHART)).crds, "Helm does not see the chart's crds/ folder"


def _leaves(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    """Every documented key: nested objects of values.yaml down to the schema's own leaves."""
    found: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        node = schema["properties"][key]
        node = {**schema.get("definitions", {}).get(node.get("$ref", "").rsplit("/", 1)[-1], {}), **node}
        found[prefix + key] = node
        if isinstance(value, dict) and "properties" in node:
            found |= _leaves(value, {**node, "definitions": schema.get("definitions", {})}, f"{prefix}{key}.")
    return found


def test_every_value_is_commented_described_and_in_the_chart_readme() -> None:
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    schema = json.loads((CHART / "values.schema.json").read_text())
    readme = (CHART / "README.md").read_text()
    lines = text.splitlines()
    assert lines[0] == "# yaml-language-server: $schema=values.schema.json"
    documented = _leaves(values, schema)
    for key, node in documented.items():
        assert node.get("description"), f"values.schema.json: {key} has no description"
        if not any(other.startswith(f"{key}.") for other in documented):
            assert f"`{key}`" in readme, f"README.md does not name {key}"
        leaf = key.rsplit(".", 1)[-1]
        (index,) = [
            i
            for i, line in enumerate(lines)
            if line.lstrip().startswith(f"{leaf}:") and _depth(lines, i) == key
        ]
        assert lines[index - 1].lstrip().startswith("#"), f"values.yaml: {key} has no comment"


def _depth(lines: list[str], index: int) -> str:
    """The dotted key of line `index` in values.yaml, from the indentation above it."""
    line = lines[index]
    indent = len(line) - len(line.lstrip())
    parts = [line.strip().split(":", 1)[0]]
    for previous in reversed(lines[:index]):
        stripped = previous.lstrip()
        if stripped and not stripped.startswith("#") and len(previous) - len(stripped) < indent:
            parts.insert(0, stripped.split(":", 1)[0])
            indent = len(previous) - len(stripped)
    return ".".join(parts)


def test_full_name_override_names_every_operator_resource() -> None:
    objects = render({"fullnameOverride": "inference-operator"})
    names = {(o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] != "ConfigMap"}
    assert all(name.startswith("inference-operator") for _, name in names), names
    assert {("Deployment", "inference-operator"), ("ServiceAccount", "inference-operator")} <= names
    assert ("Deployment", "inference-operator-router") in names


def test_the_chart_icon_exists_where_chart_yaml_points() -> None:
    icon = yaml.safe_load((CHART / "Chart.yaml").read_text())["icon"]
    prefix = "https://raw.githubusercontent.com/batchd/batchd/main/"
    assert icon.startswith(prefix) and (ROOT / icon.removeprefix(prefix)).is_file()
