"""The operator's one place between its loops and the Kubernetes API: the connection, a lock per
BatchedDeployment, the writes it made itself, the status writer, and each resource parsed once.

Children are written by Server-Side Apply under one field manager: the live child then holds what
the spec renders (a field the operator stops sending leaves it) and the fields other managers own
stay. The status is written only through `write_status`, section by section.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from batchd.api.kube_connection import ApiError, resource_path
from batchd.api.pod import CANARY, STABLE, config_map_name
from batchd.api.pod import child_name as track_child_name
from batchd.api.spec import API_VERSION, PLURAL
from batchd.api.status import BatchedDeploymentStatus
from batchd.operator import children, field_owners
from batchd.operator.kube_requests import FIELD_MANAGER, KubeApi
from batchd.operator.replicas import DELETION_COST_ANNOTATION
from batchd.operator.resource import Key, Resource, parse
from batchd.operator.settings import Settings
from batchd.operator.status_writer import StatusWriter

Manifest = dict[str, Any]
CHILD_RESOURCES = {
    "ConfigMap": ("v1", "configmaps"),
    "Deployment": ("apps/v1", "deployments"),
    "Service": ("v1", "services"),
    "PodDisruptionBudget": ("policy/v1", "poddisruptionbudgets"),
    "Secret": ("v1", "secrets"),
    "ServiceAccount": ("v1", "serviceaccounts"),
    "NetworkPolicy": ("networking.k8s.io/v1", "networkpolicies"),
}


class Cluster:
    """What every loop shares; opened at startup (`connect`), closed at cleanup."""

    def __init__(self, settings: Settings, api: KubeApi) -> None:
        self.settings = settings
        self.api = api
        self.locks: defaultdict[Key, asyncio.Lock] = defaultdict(asyncio.Lock)
        # (kind, namespace, name) -> the resourceVersion our own last write produced. A watch event
        # carrying exactly that version is the echo of a write a converge already accounted for.
        self._own_writes: dict[tuple[str, str, str], str] = {}
        self._parsed: dict[Key, Resource] = {}
        self._status = StatusWriter(api, self._parent_path)
        # (namespace, Secret) -> the deployments whose spec.access reads it: the Secret watch acts
        # on these alone (one dict lookup per Secret event), and converges exactly those.
        self._secret_readers: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
        # Deployments whose NetworkPolicies were deleted since the operator started with them off:
        # once each, not at every converge.
        self._policies_removed: set[Key] = set()

    @classmethod
    async def connect(cls, settings: Settings) -> Cluster:
        return cls(settings, await KubeApi.connect(settings.kubeconfig))

    async def close(self) -> None:
        await self.api.close()

    # -- BatchedDeployments -----------------------------------------------------------------------
    def resource(self, body: Mapping[str, Any]) -> Resource:
        """`body` parsed, once per resourceVersion (watch events and reads hand the same one over)."""
        metadata = body.get("metadata") or {}
        key = (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
        known = self._parsed.get(key)
        version = metadata.get("resourceVersion")
        if known is not None and version and known.version == version:
            return known
        parsed = parse(body)
        self._parsed[key] = parsed
        return parsed

    def forget(self, key: Key) -> None:
        """A deleted resource's parse and the Secrets it read. (Its lock stays: a loop may still
        wait on it.)"""
        self._parsed.pop(key, None)
        self.reads_secrets(key, frozenset())

    # -- Secrets: the access Secret, and the users' API keys Secrets it is made from -------------
    async def read_secret(self, namespace: str, name: str) -> Manifest | None:
        """A Secret as the API server has it now (base64 data); None where there is none."""
        return await self.api.get(resource_path("v1", "secrets", namespace, name))

    def reads_secrets(self, key: Key, names: Iterable[str]) -> None:
        """The user Secrets deployment `key` reads from now on (replacing what it read before)."""
        namespace, name = key
        wanted = {(namespace, secret) for secret in names}
        for secret_key in [found for found, readers in self._secret_readers.items() if name in readers]:
            if secret_key[0] == namespace and secret_key not in wanted:
                self._secret_readers[secret_key].discard(name)
                if not self._secret_readers[secret_key]:
                    del self._secret_readers[secret_key]
        for secret_key in wanted:
            self._secret_readers[secret_key].add(name)

    def readers_of(self, namespace: str, secret: str) -> frozenset[str]:
        """The deployments of `namespace` whose access reads Secret `secret`."""
        found = self._secret_readers.get((namespace, secret))
        return frozenset(found) if found else frozenset()

    async def read(self, namespace: str, name: str) -> Resource | None:
        """The resource as the API server has it now; None once it is gone."""
        body = await self.api.get(self._parent_path(namespace, name))
        return None if body is None else self.resource(body)

    async def write_status(
        self, resource: Resource, update: BatchedDeploymentStatus, guarded: Iterable[str] = ()
    ) -> bool:
        """Write the status sections set on `update` (None removes one) over what `resource` holds;
        each replaces its stored section whole. Callers hold the resource's lock. False when a
        `guarded` section (one the update was computed from) had moved since `resource` was read."""
        return await self._status.write(
            resource.namespace, resource.name, resource.stored_status, resource.version, update, guarded
        )

    def _parent_path(self, namespace: str, name: str, subresource: str = "") -> str:
        path = resource_path(API_VERSION, PLURAL, namespace, name)
        return f"{path}/{subresource}" if subresource else path

    # -- children ----------------------------------------------------------------------------------
    async def apply(self, manifest: Manifest, namespace: str) -> Manifest:
        """Server-Side Apply of one child; the API server's answer."""
        path = self._child_path(manifest["kind"], namespace, manifest["metadata"]["name"])
        applied = await self.api.apply(path, manifest)
        folded = field_owners.upgraded(applied.get("metadata", {}).get("managedFields") or [], FIELD_MANAGER)
        if folded is not None:
            # Fields an earlier batchd set by merge patch become this manager's, then the apply
            # again removes those it no longer sends.
            await self.api.json_patch(
                path,
                [
                    {
                        "op": "test",
                        "path": "/metadata/resourceVersion",
                        "value": applied["metadata"]["resourceVersion"],
                    },
                    {"op": "replace", "path": "/metadata/managedFields", "value": folded},
                ],
            )
            applied = await self.api.apply(path, manifest)
        self._own_writes[(manifest["kind"], namespace, manifest["metadata"]["name"])] = str(
            applied.get("metadata", {}).get("resourceVersion", "")
        )
        return applied

    async def delete_canary(self, namespace: str, name: str) -> None:
        """The canary's children gone (its rollout ended); those already gone are fine."""
        for kind in children.CANARY_KINDS:
            child = config_map_name(name, CANARY) if kind == "ConfigMap" else track_child_name(name, CANARY)
            await self.api.delete(self._child_path(kind, namespace, child))

    async def remove_network_policies(self, namespace: str, name: str) -> None:
        """With network policies off, those an earlier run made go (once per deployment and run;
        those already gone are fine)."""
        if (namespace, name) in self._policies_removed:
            return
        for track in (STABLE, CANARY):
            await self.api.delete(self._child_path("NetworkPolicy", namespace, track_child_name(name, track)))
        self._policies_removed.add((namespace, name))

    def is_own_echo(self, child: Mapping[str, Any], event_type: str) -> bool:
        """True for the watch event of our own last write to this child (nothing new to act on)."""
        meta = child.get("metadata", {})
        key = (str(child.get("kind", "")), str(meta.get("namespace", "")), str(meta.get("name", "")))
        if event_type == "DELETED":
            self._own_writes.pop(key, None)
            return False
        return bool(meta.get("resourceVersion")) and self._own_writes.get(key) == meta.get("resourceVersion")

    def _child_path(self, kind: str, namespace: str, name: str) -> str:
        api_version, plural = CHILD_RESOURCES[kind]
        return resource_path(api_version, plural, namespace, name)

    # -- replica pods (the ReplicaSets' children, not the operator's) --------------------------------
    async def set_deletion_cost(self, namespace: str, pod: str, cost: int) -> None:
        """The pod's deletion cost (the ReplicaSet controller removes the cheapest first); a pod
        already gone is fine."""
        patch = {"metadata": {"annotations": {DELETION_COST_ANNOTATION: str(cost)}}}
        try:
            await self.api.merge_patch(resource_path("v1", "pods", namespace, pod), patch)
        except ApiError as error:
            if error.status != 404:
                raise
