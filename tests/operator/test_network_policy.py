"""Each track's NetworkPolicy: its replicas reached on the http port only by the routers, the
operator (composers too call through the router), on the metrics port only by the scraper and
the operator; turned off by the operator's settings."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from batchd.api.manifest import parse_manifest
from batchd.api.pod import REPLICA_METRICS_PORT, REPLICA_PORT, REVISION_LABEL, labels, selector_labels
from batchd.api.spec import BatchedDeployment
from batchd.operator import children
from batchd.operator.network_policy import network_policy
from batchd.operator.settings import Settings
from batchd.testing.manifests import manifest
from batchd.testing.schemas import KUBERNETES_VERSIONS

ROUTED = Settings(
    router_url="http://batchd-router.batchd-system.svc",
    router_namespace="batchd-system",
    router_selector="app.kubernetes.io/component=router,app.kubernetes.io/instance=batchd",
    operator_namespace="batchd-system",
    operator_selector="app.kubernetes.io/component=operator,app.kubernetes.io/instance=batchd",
    scraper_namespace_selector={"kubernetes.io/metadata.name": "monitoring"},
)


def bd(name: str = "minilm", **model: Any) -> BatchedDeployment:
    return parse_manifest(manifest(name, model or "examples.adder:BatchAdder.handle_batch", namespace="ml"))


def ingress(policy: dict[str, Any], port: int) -> list[dict[str, Any]]:
    (rule,) = [
        rule for rule in policy["spec"]["ingress"] if rule["ports"] == [{"protocol": "TCP", "port": port}]
    ]
    found: list[dict[str, Any]] = rule.get("from", [])
    return found


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_policy_is_valid_for_every_supported_kubernetes(version: str) -> None:
    for track in ("stable", "canary"):
        kubernetes_validate.validate(network_policy(bd(), ROUTED, track), version, strict=True)


def test_replicas_are_reached_by_the_routers_and_the_operator_only() -> None:
    policy = network_policy(bd(), ROUTED)
    assert policy["spec"]["podSelector"] == {"matchLabels": selector_labels("minilm")}
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    system = {"matchLabels": {"kubernetes.io/metadata.name": "batchd-system"}}
    routers = {
        "namespaceSelector": system,
        "podSelector": {
            "matchLabels": {"app.kubernetes.io/component": "router", "app.kubernetes.io/instance": "batchd"}
        },
    }
    operator = {
        "namespaceSelector": system,
        "podSelector": {
            "matchLabels": {"app.kubernetes.io/component": "operator", "app.kubernetes.io/instance": "batchd"}
        },
    }
    assert ingress(policy, REPLICA_PORT) == [routers, operator]
    scraper = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    assert ingress(policy, REPLICA_METRICS_PORT) == [scraper, operator]
    canary = network_policy(bd(), ROUTED, "canary")
    assert canary["metadata"]["name"] == "minilm-canary"
    assert canary["spec"]["podSelector"] == {"matchLabels": selector_labels("minilm", "canary")}


def test_a_composer_is_let_in_by_nothing_its_pods_carry_it_calls_through_the_router() -> None:
    composer = bd("relay", handler="examples.classifier:EmbeddingClassifier", calls={"embedder": "minilm"})
    template = children.deployment(composer, ROUTED)["spec"]["template"]["metadata"]["labels"]
    policy = network_policy(bd(), ROUTED)
    admitted = [peer for peer in ingress(policy, REPLICA_PORT) if "namespaceSelector" not in peer]
    assert admitted == []  # every peer is named with its namespace: the router's and the operator's
    assert set(template) == {*labels("relay"), REVISION_LABEL}  # nothing that would open a policy


def test_without_a_router_clients_reach_the_http_port_but_never_the_metrics_port() -> None:
    policy = network_policy(bd(), Settings())
    assert ingress(policy, REPLICA_PORT) == []  # no `from`: every pod (clients call the Service)
    assert ingress(policy, REPLICA_METRICS_PORT) == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    ]


def test_a_policy_per_track_unless_turned_off() -> None:
    def kinds(settings: Settings) -> list[str]:
        found = children.children(bd(), settings) + children.canary_children(bd(), settings, 1)
        return [child["kind"] for child in found]

    assert kinds(ROUTED).count("NetworkPolicy") == 2
    assert "NetworkPolicy" not in kinds(Settings(network_policy=False))
    assert "NetworkPolicy" in children.CANARY_KINDS  # deleted with the canary's other children
