"""What the operator sends to the Kubernetes API for the children: GET, POST, merge-PATCH, JSON
patch, DELETE and the status subresource, plain dicts in and out (the connection:
`batchd.api.kube_connection`)."""

from __future__ import annotations

import json
from typing import Any

from batchd.api.kube_connection import ApiError, KubeConnection

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class KubeApi(KubeConnection):
    """The operator's requests; one connection pool for its lifetime, opened at startup, closed at
    cleanup."""

    component = "operator"

    async def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> dict[str, Any]:
        response = await self.call(method, path, body=body, content_type=content_type)
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

    async def create(self, collection_path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", collection_path, body)

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("PATCH", path, body, content_type=MERGE_PATCH)

    async def delete(self, path: str) -> None:
        """Delete the object at `path`; one that is not there is fine."""
        try:
            await self.request("DELETE", path)
        except ApiError as error:
            if error.status != 404:
                raise

    async def json_patch(self, path: str, operations: list[dict[str, Any]]) -> dict[str, Any]:
        """RFC 6902 operations, applied all or none: a failed `test` refuses the whole patch (422)."""
        return await self.request("PATCH", path, operations, content_type=JSON_PATCH)
