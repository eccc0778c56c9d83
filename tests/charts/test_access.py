"""The chart's part of access: what it tells the operator about the replicas' NetworkPolicies (the
operator's settings read from the rendered environment, and the policy they render), and the
grants access needs (the operator's, the router's, and the `<release>-invoker` ClusterRole users
bind to their callers)."""

from __future__ import annotations

from typing import Any

import pytest

from batchd.api.manifest import parse_manifest
from batchd.api.pod import REPLICA_METRICS_PORT, REPLICA_PORT
from batchd.operator.network_policy import network_policy
from batchd.operator.settings import Settings
from batchd.testing.helm import render
from batchd.testing.manifests import manifest


def operator_settings(values: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    (deployment,) = [
        o
        for o in render(values)
        if o["kind"] == "Deployment" and o["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
    ]
    pod = deployment["spec"]["template"]
    for item in pod["spec"]["containers"][0]["env"]:
        monkeypatch.setenv(item["name"], item["value"])
    settings = Settings.from_env()
    # The operator's own pods are what the policy's operator peer selects.
    labels = pod["metadata"]["labels"]
    assert all(labels[k] == v for k, v in (t.split("=") for t in settings.operator_selector.split(",")))
    return settings


def policy_of(settings: Settings) -> dict[str, Any]:
    return network_policy(parse_manifest(manifest("minilm", namespace="ml")), settings)


def sources(policy: dict[str, Any], port: int) -> list[dict[str, Any]]:
    (rule,) = [r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == port]
    found: list[dict[str, Any]] = rule.get("from", [])
    return found


def test_the_policy_admits_this_releases_routers_and_operator_and_the_scraper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scraper = {"namespaceSelector": {"team": "observability"}, "podSelector": {"app": "prom"}}
    settings = operator_settings({"networkPolicy": {"scraper": scraper}}, monkeypatch)
    assert settings.network_policy is True
    assert settings.operator_namespace == settings.router_namespace == "batchd-system"
    policy = policy_of(settings)
    http = sources(policy, REPLICA_PORT)
    router, operator = http
    assert router["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/component": "router",
        "app.kubernetes.io/instance": "batchd",
    }
    assert router["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "batchd-system"}}
    assert operator["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"
    assert sources(policy, REPLICA_METRICS_PORT) == [
        {
            "namespaceSelector": {"matchLabels": {"team": "observability"}},
            "podSelector": {"matchLabels": {"app": "prom"}},
        },
        operator,
    ]


def test_by_default_the_prometheus_pods_of_any_namespace_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = operator_settings({}, monkeypatch)
    assert sources(policy_of(settings), REPLICA_METRICS_PORT)[0] == {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }


def test_network_policies_turned_off_reach_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    assert operator_settings({"networkPolicy": {"enabled": False}}, monkeypatch).network_policy is False
