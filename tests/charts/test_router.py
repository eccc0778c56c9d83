"""The router the chart runs per release: its pods, Service, RBAC, disruption budget and monitor,
rendered by the real Helm library; its RBAC is exactly the router's own rules
(`batchd.router.rbac`), and the variables it is given are what its settings read."""

from __future__ import annotations

from typing import Any

import pytest

from batchd.operator.settings import Settings
from batchd.router import rbac
from batchd.router.settings import RouterSettings
from batchd.testing.helm import SCENARIOS, only, render


def router(objects: list[dict[str, Any]], kind: str | None = None) -> Any:
    """The router's objects (or its one object of `kind`)."""
    mine = [o for o in objects if o["metadata"]["labels"].get("app.kubernetes.io/component") == "router"]
    return only(mine, kind) if kind else mine


def env_of(deployment: dict[str, Any]) -> dict[str, str]:
    return {
        item["name"]: item["value"] for item in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }


def test_two_routers_listen_on_the_pod_network_probed_and_hardened(monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = router(render(), "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Clients' port and the admin one (/metrics, /held), apart.
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"http": 8080, "admin": 9090}
    assert env_of(deployment)["BATCHD_ADMIN_PORT"] == "9090"
    assert pod["serviceAccountName"] == router(render(), "ServiceAccount")["metadata"]["name"]
    for variable, value in env_of(deployment).items():
        monkeypatch.setenv(variable, value)
    settings = RouterSettings.from_env()
    assert (settings.host, settings.namespaces) == ("0.0.0.0", ())
    assert (settings.max_held_per_deployment, settings.hold_timeout_s, settings.hold_retry_after_s) == (
        256,
        30,
        5,
    )


def test_hold_bounds_and_replicas_reach_the_router(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "router": {
            "replicaCount": 4,
            "hold": {"maxPerDeployment": 10, "timeoutSeconds": 120, "retryAfterSeconds": 9},
        }
    }
    deployment = router(render(values), "Deployment")
    assert deployment["spec"]["replicas"] == 4
    for variable, value in env_of(deployment).items():
        monkeypatch.setenv(variable, value)
    settings = RouterSettings.from_env()
    assert (settings.max_held_per_deployment, settings.hold_timeout_s, settings.hold_retry_after_s) == (
        10,
        120,
        9,
    )


def test_the_service_budget_and_monitor_select_the_router_pods_only() -> None:
    objects = render(SCENARIOS["monitoring-values"])
    labels = router(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    operator_labels = next(
        o["spec"]["template"]["metadata"]["labels"]
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    )
    service = router(objects, "Service")
    budget = router(objects, "PodDisruptionBudget")
    monitor = router(objects, "ServiceMonitor")
    for selector in (service["spec"]["selector"], budget["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items() and not selector.items() <= operator_labels.items()
    assert budget["spec"]["maxUnavailable"] == 1
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    # Metrics on the admin port, which the Service names for the monitor alone.
    assert monitor["spec"]["endpoints"][0] == {"port": "admin", "path": "/metrics", "interval": "30s"}
    admin = {"name": "admin", "port": 9090, "targetPort": "admin", "protocol": "TCP"}
    assert admin in service["spec"]["ports"]
    assert [p["name"] for p in router(render(), "Service")["spec"]["ports"]] == ["http"]
    # Without the Prometheus Operator, scrape annotations on the pods instead.
    plain = router(render(), "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert plain["prometheus.io/scrape"] == "true" and plain["prometheus.io/port"] == "9090"


def bindings_of(objects: list[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    return [o for o in router(objects) if o["kind"].endswith("Binding") and o["roleRef"]["name"] == role]


def test_the_routers_cluster_role_is_exactly_its_own_rules() -> None:
    objects = render()
    role = router(objects, "ClusterRole")
    assert role["rules"] == rbac.rbac_rules()
    (binding,) = bindings_of(objects, role["metadata"]["name"])
    assert binding["subjects"][0]["name"] == router(objects, "ServiceAccount")["metadata"]["name"]


@pytest.mark.parametrize("scenario", ["default", "namespaced-values"])
def test_the_router_may_review_callers_cluster_wide_and_nothing_more(scenario: str) -> None:
    """Token and access reviews are cluster-scoped: the router's one cluster-wide grant, however
    few namespaces it watches, is Kubernetes' own role for exactly them."""
    objects = render(SCENARIOS[scenario])
    (binding,) = bindings_of(objects, rbac.AUTH_DELEGATOR)
    assert binding["kind"] == "ClusterRoleBinding" and binding["roleRef"]["kind"] == "ClusterRole"
    assert binding["subjects"][0]["name"] == router(objects, "ServiceAccount")["metadata"]["name"]


def test_watching_listed_namespaces_the_router_gets_a_role_in_each_and_reads_only_those(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = render(SCENARIOS["namespaced-values"])
    kinds = [o["kind"] for o in router(objects)]
    assert "ClusterRole" not in kinds
    assert [o["roleRef"]["name"] for o in router(objects) if o["kind"] == "ClusterRoleBinding"] == [
        rbac.AUTH_DELEGATOR
    ]
    roles = [
        o for o in router(objects) if o["kind"] == "Role" and not o["metadata"]["name"].endswith("-peers")
    ]
    assert sorted(role["metadata"]["namespace"] for role in roles) == ["team-a", "team-b"]
    for role in roles:
        assert role["rules"] == rbac.role("x", role["metadata"]["namespace"])["rules"]
    for variable, value in env_of(router(objects, "Deployment")).items():
        monkeypatch.setenv(variable, value)
    assert RouterSettings.from_env().namespaces == ("team-a", "team-b")


def test_the_operator_may_list_the_router_pods_where_no_other_grant_reaches() -> None:
    objects = render(SCENARIOS["namespaced-values"])
    (role,) = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == "batchd-router-pods"]
    assert role["metadata"]["namespace"] == "batchd-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    (binding,) = [
        o for o in objects if o["kind"] == "RoleBinding" and o["metadata"]["name"] == "batchd-router-pods"
    ]
    assert binding["subjects"][0]["name"] == "batchd"
    # Watching its own namespace (or the cluster) the operator may list pods there already.
    for values in (
        {},
        {"watchNamespaces": ["batchd-system", "team-a"]},
        {"router": {"enabled": False}, **SCENARIOS["namespaced-values"]},
    ):
        assert "batchd-router-pods" not in {o["metadata"]["name"] for o in render(values)}


def test_without_the_router_nothing_of_it_is_rendered_and_the_operator_is_told_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = render({"router": {"enabled": False}})
    assert router(objects) == []
    (operator,) = [o for o in objects if o["kind"] == "Deployment"]
    for variable, value in env_of(operator).items():
        monkeypatch.setenv(variable, value)
    assert not Settings.from_env().routers_run


def test_each_router_follows_its_own_services_endpoints_to_share_the_quotas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objects = render(SCENARIOS["namespaced-values"])
    for variable, value in env_of(router(objects, "Deployment")).items():
        monkeypatch.setenv(variable, value)
    settings = RouterSettings.from_env()
    service = router(objects, "Service")["metadata"]
    assert (settings.router_service, settings.router_namespace) == (service["name"], "batchd-system")
    # The release's namespace is not watched: the routers may read their own slices there, only.
    (role,) = [
        o for o in router(objects) if o["kind"] == "Role" and o["metadata"]["namespace"] == "batchd-system"
    ]
    assert role["rules"] == [
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}
    ]
    (binding,) = bindings_of(objects, role["metadata"]["name"])
    assert binding["subjects"][0]["name"] == router(objects, "ServiceAccount")["metadata"]["name"]
    assert not [o for o in router(render()) if o["kind"] == "Role"]  # cluster-wide: the ClusterRole has them
