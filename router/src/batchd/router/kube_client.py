"""The router's client of the Kubernetes API (the connection: `batchd.api.kube_connection`): the
LIST and WATCH its watches make (`watching`), plain dicts out, and the reviews of callers' tokens
(`token_reviews`, through the connection's `call`). The router only reads, and needs its objects'
changes as they happen."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from batchd.api.kube_connection import ApiError, KubeConnection

MAX_EVENT_BYTES = 8 * 1024 * 1024


class KubeClient(KubeConnection):
    """The router's reads; one connection pool for its lifetime, opened at startup, closed at
    shutdown."""

    component = "router"

    async def _open(self, path: str, params: list[tuple[str, str]], timeout_s: float) -> Any:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        return await self.call("GET", path, query=params, transport_timeout=timeout)

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
