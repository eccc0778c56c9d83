"""The chart's RBAC grants exactly the API calls the operator makes, judged by a real API server.

The chart is installed with `helm install`; the operator runs on its ServiceAccount's token, through
a lifecycle of BatchedDeployments driven with `kubectl`; the API server's audit log says every call
it made and what it was answered. Every call must be allowed (no 403), and every grant used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from batchd.testing.helm import SCENARIOS, render
from batchd.testing.kubernetes.components import forbidden
from batchd.testing.kubernetes.controlplane import ControlPlane, unique_name
from batchd.testing.kubernetes.release import Release, installed
from batchd.testing.manifests import manifest
from batchd.testing.waiting import eventually

Call = tuple[str, str, str]

# Grants the lifecycle below cannot reach on a control plane without a node: the autoscaler marks
# the least loaded pod (its deletion cost) only when it scales running replicas down.
NEEDS_RUNNING_REPLICAS: frozenset[Call] = frozenset({("", "pods", "patch")})


def granted(rules: list[dict[str, Any]]) -> set[Call]:
    """Every (group, resource, verb) the rules allow; wildcards refused outright (least privilege)."""
    calls = set()
    for rule in rules:
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"], rule
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    calls.add((group, resource, verb))
    return calls


def rbac_of(values: dict[str, Any]) -> list[set[Call]]:
    """The grants of each of the operator's (Cluster)Roles the chart renders for these values (the
    router's are its own rules, `tests/charts/test_router.py`; the operator's Role to list the
    router pods, where no other grant reaches, is checked there too)."""
    return [
        granted(o["rules"])
        for o in render(values)
        if o["kind"] in ("ClusterRole", "Role")
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
        and not o["metadata"]["name"].endswith("-router-pods")
    ]


def calls_of(cluster: ControlPlane, user: str) -> set[Call]:
    """Every (group, resource[/subresource], verb) the API server saw `user` ask for."""
    calls = set()
    for event in cluster.audit_events(user):
        ref = event.get("objectRef")
        if ref:
            resource = "/".join(filter(None, [ref.get("resource"), ref.get("subresource")]))
            calls.add((ref.get("apiGroup", ""), resource, event["verb"]))
            if event["verb"] == "patch" and event.get("responseStatus", {}).get("code") == 201:
                # An apply that made the object: the API server asked RBAC for `create` too.
                calls.add((ref.get("apiGroup", ""), resource, "create"))
    return calls


@dataclass(frozen=True)
class Lifecycle:
    release: Release
    calls: frozenset[Call]
    refused: list[str]


def apply(release: Release, document: dict[str, Any]) -> None:
    release.apply(document)


def exercise_operator(release: Release) -> None:
    """A BatchedDeployment created, scaled through its spec and its scale subresource, a child
    deleted and one edited (both repaired), one whose Deployment the API server refuses, a canary
    rollout begun and undone, and a delete."""
    cluster, ns = release.cluster, release.namespace

    def replicas() -> int | None:
        replicas: int | None = (release.get("deployment", "lifecycle") or {}).get("spec", {}).get("replicas")
        return replicas

    apply(release, manifest("lifecycle"))
    eventually(lambda: release.get("deployment", "lifecycle"), what="the Deployment")
    cluster.kubectl("patch", "-n", ns, "bd/lifecycle", "--type=merge", "-p", '{"spec": {"num_replicas": 2}}')
    eventually(lambda: replicas() == 2, what="the spec's replicas")
    cluster.kubectl("scale", "-n", ns, "bd/lifecycle", "--replicas=3")
    eventually(lambda: replicas() == 3, what="the scale")
    cluster.kubectl("delete", "-n", ns, "service/lifecycle")
    eventually(lambda: release.get("service", "lifecycle"), what="the Service restored")
    cluster.kubectl(
        "patch", "-n", ns, "deployment/lifecycle", "--type=merge", "-p", '{"spec": {"replicas": 7}}'
    )
    eventually(lambda: replicas() == 3, what="the edit undone")
    apply(release, manifest("refused", env=[{"name": "NO-SUCH=NAME", "value": "x"}]))

    def refusal_events() -> list[Any]:
        listed = cluster.kubectl(
            "get", "events", "-n", ns, "--field-selector", "reason=DeploymentRefused", "-o", "json"
        ).stdout
        items: list[Any] = json.loads(listed)["items"]
        return items

    eventually(refusal_events, what="an event saying the Deployment was refused")
    # A canary rollout begun (its own Deployment, Service and ConfigMap), then undone by putting
    # the stable model back: the canary's children are deleted.
    canary = {"strategy": "canary"}
    apply(release, manifest("canaried", rollout=canary))
    eventually(lambda: release.get("deployment", "canaried"), what="the stable Deployment")
    apply(release, manifest("canaried", "batchd.testing.batch_handlers:add_one", rollout=canary))
    eventually(lambda: release.get("deployment", "canaried-canary"), what="the canary's Deployment")
    apply(release, manifest("canaried", rollout=canary))
    eventually(lambda: release.get("service", "canaried-canary") is None, what="the canary's children gone")
    cluster.kubectl("delete", "-n", ns, "bd/lifecycle", "bd/refused", "bd/canaried")


@pytest.fixture(scope="module")
def lifecycle(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lifecycle]:
    logs = tmp_path_factory.mktemp("rbac")
    with installed(control_plane, logs) as release:
        user = release.operator_user
        with release.operator(logs / "operator.log"):
            exercise_operator(release)
        yield Lifecycle(release, frozenset(calls_of(control_plane, user)), forbidden(control_plane, user))


@pytest.mark.slow
def test_the_lifecycle_exercised_the_operator(lifecycle: Lifecycle) -> None:
    # A lenient record would make the comparisons below pass vacuously.
    for call in [
        ("apps", "deployments", "create"),
        ("apps", "deployments", "patch"),
        ("", "services", "create"),
        ("policy", "poddisruptionbudgets", "create"),
        ("", "events", "create"),
        ("apps", "deployments", "delete"),
        ("serving.batchd.dev", "batcheddeployments", "watch"),
        ("serving.batchd.dev", "batcheddeployments/status", "patch"),
    ]:
        assert call in lifecycle.calls, call


@pytest.mark.slow
def test_the_api_server_refused_the_operator_nothing(lifecycle: Lifecycle) -> None:
    assert lifecycle.refused == []


@pytest.mark.slow
def test_the_cluster_role_grants_nothing_the_operator_never_used(lifecycle: Lifecycle) -> None:
    role = lifecycle.release.get("clusterrole", lifecycle.release.name)
    assert role is not None
    unused = granted(role["rules"]) - lifecycle.calls - NEEDS_RUNNING_REPLICAS
    assert not unused, f"granted but never used by the operator: {sorted(unused)}"


@pytest.mark.slow
def test_an_operator_and_router_held_to_listed_namespaces_need_nothing_cluster_wide(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> None:
    logs = tmp_path_factory.mktemp("rbac-namespaced")
    name = unique_name("batchd-scoped")
    with installed(control_plane, logs, {"watchNamespaces": [name]}, name=name) as release:
        assert release.get("clusterrole", release.name) is None
        with release.operator(logs / "operator.log"):
            apply(release, manifest("scoped"))
            eventually(lambda: release.get("deployment", "scoped"), what="the Deployment")
            control_plane.kubectl("delete", "-n", name, "bd/scoped")
        with release.router(logs / "router.log", 0):
            pass
        assert forbidden(control_plane, release.operator_user) == []
        assert forbidden(control_plane, release.router_user) == []


def test_no_rbac_is_rendered_when_turned_off() -> None:
    assert rbac_of({"rbac": {"create": False}}) == []


def test_the_namespaced_scenario_renders_roles_only() -> None:
    kinds = {o["kind"] for o in render(SCENARIOS["namespaced-values"])}
    assert "ClusterRole" not in kinds and "Role" in kinds
