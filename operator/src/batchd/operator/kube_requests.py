"""What the operator sends to the Kubernetes API: GET, Server-Side Apply, JSON patch and DELETE,
plain dicts in and out (the connection: `batchd.api.kube_connection`)."""

from __future__ import annotations

import json
from typing import Any

from batchd.api.kube_connection import ApiError, KubeConnection

# Every write names this manager (the API server keeps it in each object's managedFields).
FIELD_MANAGER = "batchd-operator"
APPLY_PATCH = "application/apply-patch+yaml"  # JSON is YAML: the body is sent as JSON
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class KubeApi(KubeConnection):
    """The operator's requests; one connection pool for its lifetime, opened at startup, closed at
    cleanup."""

    component = "operator"

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: tuple[tuple[str, str], ...] = (),
    ) -> dict[str, Any]:
        response = await self.call(method, path, query=query, body=body, content_type=content_type)
        raw = await response.read()
        try:
            payload: Any = json.loads(raw) if raw else {}
        except ValueError:
            payload = {"message": raw.decode(errors="replace")}
        return payload if isinstance(payload, dict) else {}

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", path)
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    async def apply(self, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
        """Server-Side Apply of `manifest` (created if absent): afterwards the object holds what it
        says, and of the fields this manager set before only those it still sets. A field another
        manager set differently is taken over (force): the operator owns what it renders."""
        query = (("fieldManager", FIELD_MANAGER), ("force", "true"))
        return await self.request("PATCH", path, manifest, content_type=APPLY_PATCH, query=query)

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """For objects the operator does not own (a pod's deletion cost)."""
        query = (("fieldManager", FIELD_MANAGER),)
        return await self.request("PATCH", path, body, content_type=MERGE_PATCH, query=query)

    async def json_patch(self, path: str, operations: list[dict[str, Any]]) -> dict[str, Any]:
        """RFC 6902 operations, applied all or none: a failed `test` refuses the whole patch (422)."""
        query = (("fieldManager", FIELD_MANAGER),)
        return await self.request("PATCH", path, operations, content_type=JSON_PATCH, query=query)

    async def delete(self, path: str) -> None:
        """Delete the object at `path`; one that is not there is fine."""
        try:
            await self.request("DELETE", path)
        except ApiError as error:
            if error.status != 404:
                raise
