"""The NetworkPolicy of each track's replica pods: who may reach them at all, as a pure function.

The replicas refuse stamps they cannot verify whatever the network does (`stamp`); the policy
adds that nobody else reaches them: on the http port only the chart's router pods (in the
release's namespace) and the operator (it reads each replica's GET /load there). Composers call
their callees through the router too, so no label a pod could carry lets it in around the router.
On the metrics port only the scraper the chart names, and the operator (the canary judge reads
/metrics).
Without a router, clients call the deployment's Service directly, so its http port stays open
to every pod (the metrics port is still closed to all but the scraper and the operator).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batchd.api.pod import (
    REPLICA_METRICS_PORT,
    REPLICA_PORT,
    STABLE,
    Track,
    child_name,
    labels,
    selector_labels,
)
from batchd.api.spec import BatchedDeployment
from batchd.operator.settings import Settings

Manifest = dict[str, Any]
# The label every namespace carries, set by the API server from its name.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


def match_labels(selector: str) -> dict[str, str]:
    """An equality selector in `kubectl -l` form (`a=b,c=d`) as matchLabels."""
    return dict(term.split("=", 1) for term in selector.split(",") if "=" in term)


def _peer(namespace: str, pods: Mapping[str, str]) -> Manifest:
    return {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}},
        "podSelector": {"matchLabels": dict(pods)},
    }


def _port(port: int) -> list[Manifest]:
    return [{"protocol": "TCP", "port": port}]


def network_policy(bd: BatchedDeployment, settings: Settings, track: Track = STABLE) -> Manifest:
    name = bd.metadata.name
    operator = (
        [_peer(settings.operator_namespace, match_labels(settings.operator_selector))]
        if settings.operator_namespace and settings.operator_selector
        else []
    )
    routers = (
        [_peer(settings.router_namespace, match_labels(settings.router_selector))]
        if settings.router_namespace
        else []
    )
    http: Manifest = {"ports": _port(REPLICA_PORT)}
    if settings.routers_run:
        http["from"] = [*routers, *operator]
    namespaces = settings.scraper_namespace_selector
    scraper: Manifest = {"namespaceSelector": {"matchLabels": dict(namespaces)} if namespaces else {}}
    if settings.scraper_pod_selector:
        scraper["podSelector"] = {"matchLabels": dict(settings.scraper_pod_selector)}
    metrics = {"ports": _port(REPLICA_METRICS_PORT), "from": [scraper, *operator]}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": child_name(name, track), "labels": labels(name, track)},
        "spec": {
            "podSelector": {"matchLabels": selector_labels(name, track)},
            "policyTypes": ["Ingress"],
            "ingress": [http, metrics],
        },
    }
