"""The connection to the Kubernetes API that the operator and the router open: credentials, TLS and
who is calling; the paths of resources; the API server's refusal.

Both speak plain dicts over `kubernetes.aio`'s transport (kubeconfig, or the pod's service
account): the typed models of the `kubernetes` client would only add a conversion both ways. What
each sends over it (the operator's writes, the router's LIST and WATCH) stays with its process.
Needs the `kube` extra (`batchd-api[kube]`); the replica never imports it.
"""

from __future__ import annotations

import json
from typing import Any

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
