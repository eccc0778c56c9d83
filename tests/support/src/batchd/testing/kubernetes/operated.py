"""The operator on a real control plane as the chart runs it (its environment and its
ServiceAccount's token, under RBAC), and a test's namespace driven with `kubectl` as a user would."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from batchd.api.pod import config_map_name
from batchd.testing.kubernetes.components import refused
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.kubernetes.release import Release, get_object, installed, list_objects
from batchd.testing.servers import free_port


@dataclass(frozen=True)
class Operator:
    release: Release
    metrics_url: str
    liveness_url: str

    @property
    def cluster(self) -> ControlPlane:
        return self.release.cluster

    def requests(self) -> int:
        """How many requests the operator has made so far (the API server's count)."""
        return len(self.cluster.audit_events(self.release.operator_user))

    def refused(self, since: int, namespace: str) -> list[str]:
        """The operator's requests in `namespace` the API server refused (RBAC's 403s and 422s alike),
        from the `since`-th on."""
        return refused(self.cluster, self.release.operator_user, since=since, namespace=namespace)


class Namespace:
    """What a test does in its own namespace, through kubectl as cluster-admin, and what it reads
    there (through one client: tests poll these)."""

    def __init__(self, cluster: ControlPlane, name: str, api: httpx.Client) -> None:
        self.cluster = cluster
        self.name = name
        self.api = api

    def kubectl(self, *args: str, **kwargs: Any) -> str:
        return self.cluster.kubectl("-n", self.name, *args, **kwargs).stdout

    def apply(self, document: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(document))

    def get(self, kind: str, name: str) -> dict[str, Any]:
        """The object, or {} when there is none."""
        return get_object(self.api, kind, name, self.name) or {}

    def bd(self, name: str) -> dict[str, Any]:
        return self.get("batcheddeployment", name)

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        for item in self.bd(name).get("status", {}).get("conditions", []):
            if item["type"] == type_:
                return dict(item)
        return {}

    def children(self, name: str) -> dict[str, dict[str, Any]]:
        return {
            "ConfigMap": self.get("configmap", config_map_name(name)),
            "Deployment": self.get("deployment", name),
            "Service": self.get("service", name),
        }

    def has_children(self, name: str) -> bool:
        return all(self.children(name).values())

    def replicas(self, name: str) -> int | None:
        replicas: int | None = self.get("deployment", name).get("spec", {}).get("replicas")
        return replicas

    def events(self, reason: str) -> list[dict[str, Any]]:
        return list_objects(self.api, "event", self.name, fieldSelector=f"reason={reason}")

    def patch(self, target: str, change: dict[str, Any], *extra: str) -> None:
        self.kubectl("patch", target, "--type=merge", "-p", json.dumps(change), *extra)


@contextlib.contextmanager
def running_operator(cluster: ControlPlane, logs: Path) -> Iterator[Operator]:
    """The chart installed, its operator a process of this machine serving metrics and liveness."""
    metrics_port, liveness_port = free_port(), free_port()
    with installed(cluster, logs) as release:
        liveness = f"http://127.0.0.1:{liveness_port}/healthz"
        env = {"BATCHD_METRICS_PORT": str(metrics_port), "BATCHD_LIVENESS_ENDPOINT": liveness}
        with release.operator(logs / "operator.log", env):
            yield Operator(release, f"http://127.0.0.1:{metrics_port}/metrics", liveness)
