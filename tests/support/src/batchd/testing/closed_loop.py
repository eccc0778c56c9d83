"""Closed-loop load on one keep-alive pool, and reading a server's Prometheus metrics: how the
router's end-to-end tests load it and see where requests went."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp

# The client's keep-alive pool.
CONNECTIONS = 16
# The outcome of a request that failed on a new connection.
UNSENT = "unsent"


async def metric(client: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`, from a server's /metrics."""
    async with client.get(f"{url}/metrics") as response:
        text = await response.text()
    total = 0.0
    for found_labels, value in re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M):
        if all(f'{key}="{wanted}"' in found_labels for key, wanted in labels.items()):
            total += float(value)
    return total


def connection_tracing() -> aiohttp.TraceConfig:
    """Tells each request whether it went out on a new connection: its `trace_request_ctx` (a
    SimpleNamespace) gets `new_connection = True`. A request that fails on a new connection was
    never taken by the server (refused, or reset in the listener's accept queue as it closed), so a
    client may send it elsewhere; one that fails on a reused connection may have been taken."""
    tracing = aiohttp.TraceConfig()

    async def created(session: Any, context: SimpleNamespace, params: Any) -> None:
        context.trace_request_ctx.new_connection = True

    tracing.on_connection_create_end.append(created)
    return tracing


@dataclass
class KeepAliveClient:
    """`connections` workers on one keep-alive pool, each sending its next request when its last
    one is answered (closed loop: the load follows what the replicas can do, no queue overflows).
    Each outcome is an HTTP status, or the name of the error when no answer came: UNSENT when the
    request failed on a new connection (the server never took it)."""

    url: str
    connections: int = CONNECTIONS
    outcomes: list[int | str] = field(default_factory=list)
    # (status, Retry-After, body) of every answer that is not a 200
    refusals: list[tuple[int, str | None, str]] = field(default_factory=list)
    # "name: message" of every request that got no answer
    errors: list[str] = field(default_factory=list)
    retry_unsent: bool = False  # send again what the server never took (UNSENT)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> list[int | str]:
        connector = aiohttp.TCPConnector(limit=self.connections)
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, trace_configs=[connection_tracing()]
        ) as client:
            await asyncio.gather(*(self._worker(client) for _ in range(self.connections)))
        return self.outcomes

    async def _worker(self, client: aiohttp.ClientSession) -> None:
        while not self._stop.is_set():
            n = len(self.outcomes)
            request = SimpleNamespace(new_connection=False)
            try:
                async with client.post(
                    self.url, json={"instances": [n]}, trace_request_ctx=request
                ) as response:
                    body = await response.read()
                    self.outcomes.append(response.status)
                    if response.status != 200:
                        retry_after = response.headers.get("Retry-After")
                        self.refusals.append((response.status, retry_after, body.decode(errors="replace")))
            except (aiohttp.ClientError, TimeoutError) as error:
                unsent = isinstance(error, aiohttp.ClientConnectorError) or request.new_connection
                self.outcomes.append(UNSENT if unsent else type(error).__name__)
                self.errors.append(f"{type(error).__name__}: {error}")
                if unsent and not self.retry_unsent:
                    raise
                if unsent:
                    await asyncio.sleep(0.05)  # the client's back-off while nothing takes it

    def stop(self) -> None:
        self._stop.set()

    def answered(self) -> int:
        return sum(isinstance(outcome, int) for outcome in self.outcomes)
