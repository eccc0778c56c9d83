"""A small asynchronous Kubernetes API client for the children: plain dicts in, plain dicts out.

The operator builds manifests as dicts and only needs GET, POST, merge-PATCH and the status
subresource; the typed models of the `kubernetes` client would only add a conversion both ways.
Transport, TLS and credentials come from `kubernetes.aio` (kubeconfig or the pod's service account).
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.aio import client as aio_client
from kubernetes.aio import config as aio_config

MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    """A refusal from the API server, with its status code and its own message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def object_path(api_version: str, plural: str, namespace: str, name: str | None = None) -> str:
    """`/api/v1/namespaces/ns/services/name` or `/apis/apps/v1/namespaces/ns/deployments`."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name else path


class KubeApi:
    """One connection pool for the operator's lifetime; opened at startup, closed at cleanup."""

    def __init__(self, api_client: aio_client.ApiClient) -> None:
        self._client = api_client

    @classmethod
    async def connect(cls, kubeconfig: str = "") -> KubeApi:
        configuration = aio_client.Configuration()
        if kubeconfig:
            await aio_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            aio_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return cls(aio_client.ApiClient(configuration))

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
        try:
            payload: Any = json.loads(raw) if raw else {}
        except ValueError:
            payload = {"message": raw.decode(errors="replace")}
        if not 200 <= response.status < 300:
            raise ApiError(response.status, str(payload.get("reason", "")), str(payload.get("message", raw)))
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
