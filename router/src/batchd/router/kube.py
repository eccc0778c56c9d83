"""A small asynchronous Kubernetes API client for LIST and WATCH: plain dicts in, plain dicts out.

The router only reads two kinds of object and needs their changes as they happen; the typed
models of the `kubernetes` client would only add a conversion. Transport, TLS and credentials
come from `kubernetes.aio` (kubeconfig or the pod's service account), as in the operator.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from kubernetes.aio import client as aio_client
from kubernetes.aio import config as aio_config

from batchd.api import __version__

USER_AGENT = f"batchd-router/{__version__}"
MAX_EVENT_BYTES = 8 * 1024 * 1024


class ApiError(Exception):
    """A refusal from the API server, with its status code and its own message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def collection_path(api_version: str, plural: str, namespace: str | None) -> str:
    """`/apis/discovery.k8s.io/v1/endpointslices` cluster-wide, or in one namespace."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"


class KubeClient:
    """One connection pool for the router's lifetime; opened at startup, closed at shutdown."""

    def __init__(self, api_client: aio_client.ApiClient) -> None:
        self._client = api_client

    @classmethod
    async def connect(cls, kubeconfig: str = "") -> KubeClient:
        configuration = aio_client.Configuration()
        if kubeconfig:
            await aio_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            aio_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        api_client = aio_client.ApiClient(configuration)
        # Audit logs, and the tests' record of who called what, tell the router from the operator.
        api_client.user_agent = USER_AGENT
        return cls(api_client)

    async def close(self) -> None:
        await self._client.close()  # type: ignore[no-untyped-call]

    async def _open(self, path: str, params: list[tuple[str, str]], timeout_s: float) -> Any:
        _, url, headers, _, _ = await self._client.param_serialize(
            method="GET",
            resource_path=path,
            query_params=params,
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        response = await self._client.call_api("GET", url, header_params=headers, _request_timeout=timeout)
        if not 200 <= response.status < 300:
            raw = await response.read()  # type: ignore[no-untyped-call]
            try:
                message = str(orjson.loads(raw).get("message", raw))
            except (orjson.JSONDecodeError, AttributeError):
                message = raw.decode(errors="replace")
            raise ApiError(response.status, message)
        return response

    async def list(
        self, path: str, label_selector: str, timeout_s: float = 30.0
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object at `path` that the selector selects, and the list's resourceVersion."""
        response = await self._open(path, [("labelSelector", label_selector)], timeout_s)
        document = orjson.loads(await response.read())
        return list(document.get("items") or []), str(document.get("metadata", {}).get("resourceVersion", ""))

    async def watch(
        self, path: str, label_selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, object) for every change after `resource_version`, until the API server ends the
        watch (`timeout_s`, or the client gives up a little later). ApiError 410 for an expired
        version, as an ERROR event or as the answer: the caller lists again."""
        params = [
            ("watch", "true"),
            ("labelSelector", label_selector),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(timeout_s)),
            ("allowWatchBookmarks", "true"),
        ]
        response = await self._open(path, params, timeout_s + 30)
        stream = response.response
        try:
            # One event a line; an object may be as large as etcd takes (about 1.5 MiB).
            while line := await stream.content.readuntil(b"\n", max_size=MAX_EVENT_BYTES):
                if not line.strip():
                    continue
                event = orjson.loads(line)
                kind, document = str(event.get("type", "")), event.get("object") or {}
                if kind == "ERROR":
                    raise ApiError(int(document.get("code") or 500), str(document.get("message", "")))
                yield kind, document
        finally:
            stream.release()
