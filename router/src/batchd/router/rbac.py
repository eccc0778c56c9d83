"""The least the router may do in the Kubernetes API: list and watch three kinds, and review callers.

It reads BatchedDeployments (model name -> deployment), the EndpointSlices of their Services
(ready replicas) and the operator's access Secrets (selected by label), and asks the API server to
review callers' tokens. It never gets single objects, creates nothing but those reviews, and reads
no Pods or Services. `rbac_rules()` are bound cluster-wide as a ClusterRole when
`BATCHD_NAMESPACES` is empty, otherwise as a Role in each namespace; the reviews are granted
cluster-wide whatever it watches (`AUTH_DELEGATOR`); and where its own namespace is not watched, a
Role there lets it follow its own Service's EndpointSlices (`peers`). The chart cannot import
these rules: it spells them again (`batchd.routerRbacRules`), and tests/charts holds the two equal.
"""

from __future__ import annotations

from typing import Any

from batchd.api.pod import ROUTER_COMPONENT
from batchd.api.spec import GROUP, PLURAL

RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (GROUP, PLURAL, ("list", "watch")),
    ("discovery.k8s.io", "endpointslices", ("list", "watch")),
    # The operator's access Secrets, selected by label (`pod.ACCESS_SECRET_SELECTOR`): RBAC cannot
    # bound a list by label, so the router asks for those alone and reads nothing else of them.
    ("", "secrets", ("list", "watch")),
)


# Reviews of a ServiceAccount token and of what its account may do (`token_reviews`): both APIs
# are cluster-scoped, and Kubernetes' own role AUTH_DELEGATOR grants exactly these two creates, so
# the chart binds that role rather than define one of its own (as kube-rbac-proxy's users do).
AUTH_DELEGATOR = "system:auth-delegator"
CLUSTER_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("authentication.k8s.io", "tokenreviews", ("create",)),
    ("authorization.k8s.io", "subjectaccessreviews", ("create",)),
)


def cluster_rbac_rules() -> list[dict[str, Any]]:
    """What the router needs cluster-wide, whatever namespaces it watches (AUTH_DELEGATOR's rules)."""
    return [
        {"apiGroups": [group], "resources": [plural], "verbs": list(verbs)}
        for group, plural, verbs in CLUSTER_RULES
    ]


def rbac_rules() -> list[dict[str, Any]]:
    """The rules of the router's Role or ClusterRole, as they go in the manifest."""
    return [
        {"apiGroups": [group], "resources": [plural], "verbs": list(verbs)} for group, plural, verbs in RULES
    ]


def role(name: str, namespace: str | None = None) -> dict[str, Any]:
    """A ClusterRole (no namespace) or a Role in `namespace` holding exactly the router's rules."""
    metadata: dict[str, Any] = {"name": name, "labels": dict(ROUTER_COMPONENT)}
    if namespace is not None:
        metadata["namespace"] = namespace
    kind = "Role" if namespace is not None else "ClusterRole"
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": metadata,
        "rules": rbac_rules(),
    }
