"""The connection to the Kubernetes API that the operator and the router open: credentials, TLS and
who is calling; the paths of resources; the API server's refusal.

Both speak plain dicts over `kubernetes.aio`'s transport (kubeconfig, or the pod's service
account): the typed models of the `kubernetes` client would only add a conversion both ways. What
each sends over it (the operator's writes, the router's LIST and WATCH) stays with its process.
Needs the `kube` extra (`batchd-api[kube]`); the replica never imports it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar, Self

from kubernetes.aio import client as aio_client
from kubernetes.aio import config as aio_config

from batchd.api import __version__


class ApiError(Exception):
    """A refusal from the API server: its status code, its reason (`NotFound`, `Conflict`, ...) when
    it gave one, and its own message."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @classmethod
    def of_answer(cls, status: int, raw: bytes) -> ApiError:
        """The refusal an answer's body describes: a `Status` object's message and reason, or
        the body itself when it is not one."""
        try:
            document: Any = json.loads(raw)
        except ValueError:
            document = None
        if not isinstance(document, dict):
            return cls(status, raw.decode(errors="replace"))
        return cls(status, str(document.get("message", "")), str(document.get("reason", "")))


def resource_path(
    api_version: str, plural: str, namespace: str | None = None, name: str | None = None
) -> str:
    """`/api/v1/namespaces/ns/services/name`, `/apis/apps/v1/namespaces/ns/deployments`, or with no
    namespace the cluster-wide collection (`/apis/discovery.k8s.io/v1/endpointslices`)."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
    return f"{path}/{name}" if name else path


async def connect(component: str, kubeconfig: str = "") -> aio_client.ApiClient:
    """An API client for one process's lifetime: from `kubeconfig`, else the pod's service account.
    Its user agent names the component, so that audit logs (and the tests' record of who called
    what) tell the router from the operator."""
    configuration = aio_client.Configuration()
    if kubeconfig:
        await aio_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        aio_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    api_client = aio_client.ApiClient(configuration)
    api_client.user_agent = f"batchd-{component}/{__version__}"
    return api_client


class KubeConnection:
    """One connection pool to the API for a process's lifetime, opened at startup and closed at
    shutdown; `call` sends one request and raises the API server's refusal as `ApiError`. The
    operator's writes and the router's reads are built on it."""

    component: ClassVar[str]  # who calls, in the user agent

    def __init__(self, api_client: aio_client.ApiClient) -> None:
        self._client = api_client

    @classmethod
    async def connect(cls, kubeconfig: str = "") -> Self:
        return cls(await connect(cls.component, kubeconfig))

    async def close(self) -> None:
        await self._client.close()  # type: ignore[no-untyped-call]

    async def call(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str | None = None,
        transport_timeout: Any = None,
    ) -> Any:
        """The answer (2xx) to one request, its body not yet read; `transport_timeout` is an
        `aiohttp.ClientTimeout` for the whole exchange."""
        header_params = {"Accept": "application/json"}
        if content_type is not None:
            header_params["Content-Type"] = content_type
        _, url, headers, serialized, _ = await self._client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params=header_params,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = await self._client.call_api(
            method, url, header_params=headers, body=serialized, _request_timeout=transport_timeout
        )
        if not 200 <= response.status < 300:
            raise ApiError.of_answer(response.status, await response.read())  # type: ignore[no-untyped-call]
        return response
