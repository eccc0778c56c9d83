"""What the operator sends to the Kubernetes API for the children: GET, POST, merge-PATCH and the
status subresource, plain dicts in and out (the connection: `batchd.api.kubeclient`)."""

from __future__ import annotations

import json
from typing import Any

from kubernetes.aio import client as aio_client

from batchd.api.kubeclient import ApiError, connect

MERGE_PATCH = "application/merge-patch+json"


class KubeApi:
    """One connection pool for the operator's lifetime; opened at startup, closed at cleanup."""

    def __init__(self, api_client: aio_client.ApiClient) -> None:
        self._client = api_client

    @classmethod
    async def connect(cls, kubeconfig: str = "") -> KubeApi:
        return cls(await connect("operator", kubeconfig))

    async def close(self) -> None:
        await self._client.close()  # type: ignore[no-untyped-call]

    async def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> dict[str, Any]:
        _, url, headers, serialized, _ = await self._client.param_serialize(
            method=method,
            resource_path=path,
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        response = await self._client.call_api(method, url, header_params=headers, body=serialized)
        raw = await response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status < 300:
            raise ApiError.of_answer(response.status, raw)
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
