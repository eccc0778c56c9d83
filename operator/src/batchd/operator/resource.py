"""One BatchedDeployment as the API server sent it, parsed once: its spec (or why it cannot be
served) and its typed status. Pure: every layer above reads a resource through this."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batchd.api.manifest import ManifestError, parse_manifest
from batchd.api.spec import BatchedDeployment
from batchd.api.status import BatchedDeploymentStatus, read_status

Key = tuple[str, str]  # (namespace, name) of a BatchedDeployment


@dataclass(frozen=True)
class Resource:
    namespace: str
    name: str
    body: Mapping[str, Any]  # as the API server sent it (owner references and events need it)
    generation: int
    status: BatchedDeploymentStatus
    bd: BatchedDeployment | None  # None: the spec cannot be served, `invalid` says why
    invalid: str = ""

    @property
    def key(self) -> Key:
        return self.namespace, self.name

    @property
    def deleting(self) -> bool:
        return bool(self.body.get("metadata", {}).get("deletionTimestamp"))

    @property
    def version(self) -> str:
        """The resourceVersion this reading is of."""
        return str(self.body.get("metadata", {}).get("resourceVersion") or "")

    @property
    def stored_status(self) -> Mapping[str, Any]:
        """The status exactly as stored (what a guarded write compares against)."""
        return self.body.get("status") or {}


def parse(body: Mapping[str, Any]) -> Resource:
    metadata = body.get("metadata") or {}
    namespace, name = str(metadata.get("namespace") or ""), str(metadata.get("name") or "")
    document = {key: body.get(key) for key in ("apiVersion", "kind", "metadata", "spec")}
    bd: BatchedDeployment | None
    try:
        bd, invalid = parse_manifest(document, origin=f"{namespace}/{name}"), ""
    except ManifestError as error:
        bd, invalid = None, str(error)
    return Resource(
        namespace=namespace,
        name=name,
        body=body,
        generation=int(metadata.get("generation") or 1),
        status=read_status(body.get("status")),
        bd=bd,
        invalid=invalid,
    )
