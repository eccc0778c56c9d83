"""The least the router may do in the Kubernetes API: list and watch two kinds, nothing else.

It reads BatchedDeployments (model name -> deployment) and the EndpointSlices of their Services
(ready replicas). It never gets single objects, never writes, and reads no Pods, Services or
Secrets. Bound cluster-wide as a ClusterRole when `BATCHD_NAMESPACES` is empty, otherwise as a
Role in each namespace. The chart renders these rules; `rbac_rules()` is their one source.
"""

from __future__ import annotations

from typing import Any

from batchd.api.pod import ROUTER_COMPONENT
from batchd.api.spec import GROUP, PLURAL

RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (GROUP, PLURAL, ("list", "watch")),
    ("discovery.k8s.io", "endpointslices", ("list", "watch")),
)


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
