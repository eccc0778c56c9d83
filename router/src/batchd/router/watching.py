"""The router's watches: BatchedDeployments (model names, who may call), their Services'
EndpointSlices, and their access Secrets (signing keys, API key digests).

Each runs LIST then WATCH from the list's resourceVersion, applying every event to the
`Directory`; when the watch ends (its timeout, 410 Gone, the API server away) it lists again, so
nothing deleted while no watch was open is remembered. EndpointSlices are selected
by labels the EndpointSlice controller copies from the operator's Services (`pod.SLICE_SELECTOR`),
so one watch sees every replica of every deployment and nothing else. The router is ready once
every list has been applied.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from batchd.api.kube_connection import ApiError, resource_path
from batchd.api.pod import ACCESS_SECRET_SELECTOR, SLICE_SELECTOR
from batchd.api.spec import GROUP, PLURAL, VERSION
from batchd.router.access import Keyring
from batchd.router.directory import Directory

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Watched:
    """One kind of object the router follows, and where its objects go in the directory."""

    what: str
    api_version: str
    plural: str
    label_selector: str
    put: Callable[[Mapping[str, Any]], None]
    delete: Callable[[Mapping[str, Any]], None]
    replace: Callable[[Iterable[Mapping[str, Any]], str | None], None]


def watched_kinds(directory: Directory, keyring: Keyring) -> tuple[Watched, Watched, Watched]:
    deployments = Watched(
        "BatchedDeployments",
        f"{GROUP}/{VERSION}",
        PLURAL,
        "",
        directory.put_deployment,
        directory.delete_deployment,
        directory.replace_deployments,
    )
    slices = Watched(
        "EndpointSlices",
        "discovery.k8s.io/v1",
        "endpointslices",
        SLICE_SELECTOR,
        directory.put_slice,
        directory.delete_slice,
        directory.replace_slices,
    )
    # The operator's access Secrets alone (by label): each deployment's signing key and API key
    # digests, never the users' own Secrets, which hold the keys.
    secrets = Watched(
        "access Secrets",
        "v1",
        "secrets",
        ACCESS_SECRET_SELECTOR,
        keyring.put_secret,
        keyring.delete_secret,
        keyring.replace_secrets,
    )
    return deployments, slices, secrets


class Source(Protocol):
    """Where objects come from: the API server (`kube_client.KubeClient`), or a test's stand-in."""

    async def list(self, path: str, label_selector: str) -> tuple[list[dict[str, Any]], str]: ...

    def watch(
        self, path: str, label_selector: str, resource_version: str, timeout_s: int
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]: ...


class Watcher:
    """LIST + WATCH of one kind in one namespace (or all), forever; `synced` once listed."""

    def __init__(
        self, api: Source, watched: Watched, namespace: str | None, *, timeout_s: int, retry_s: float
    ) -> None:
        self.api = api
        self.watched = watched
        self.namespace = namespace
        self.path = resource_path(watched.api_version, watched.plural, namespace)
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.synced = asyncio.Event()

    async def run(self) -> None:
        while True:
            try:
                await self._list_and_watch()
            except (ApiError, aiohttp.ClientError, TimeoutError, ValueError) as error:
                logger.warning(
                    "watching %s at %s: %s; again in %g s", self.watched.what, self.path, error, self.retry_s
                )
            except Exception:  # a watch that stopped for good would leave the router routing blind
                logger.exception(
                    "watching %s at %s failed; again in %g s", self.watched.what, self.path, self.retry_s
                )
            await asyncio.sleep(self.retry_s)

    async def _list_and_watch(self) -> None:
        watched = self.watched
        items, version = await self.api.list(self.path, watched.label_selector)
        watched.replace(items, self.namespace)
        self.synced.set()
        async for kind, document in self.api.watch(
            self.path, watched.label_selector, version, self.timeout_s
        ):
            if kind in ("ADDED", "MODIFIED"):
                watched.put(document)
            elif kind == "DELETED":
                watched.delete(document)
            # BOOKMARK: nothing changed; the next list starts afresh anyway.
