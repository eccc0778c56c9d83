"""Closed-loop load, and reading a server's Prometheus metrics: how the end-to-end tests load a
deployment and see where requests went. `KeepAliveClient`: many workers on one keep-alive pool
(asyncio); `SteadyLoad`: one client in a thread."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp
import httpx

# The client's keep-alive pool.
CONNECTIONS = 16
# The outcome of a request that failed on a new connection.
UNSENT = "unsent"
# SteadyLoad's bound, and its outcomes besides HTTP statuses.
LOAD_LIMIT_S = 120.0
NO_ANSWER, WRONG_ANSWER = 0, -1


async def metric(client: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`, from a server's /metrics (which
    must answer: a page that is not there is no zero)."""
    async with client.get(f"{url}/metrics") as response:
        response.raise_for_status()
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


class SteadyLoad:
    """One client's requests to an adder, one after another in a thread, until stopped (or
    LOAD_LIMIT_S), counted by their answer's status (or NO_ANSWER, WRONG_ANSWER): for tests that
    drive the cluster with blocking calls meanwhile."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.outcomes: Counter[int] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + LOAD_LIMIT_S
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    answer = client.post(self.url, json={"instances": [1, 2]})
                except httpx.TransportError:
                    self.outcomes[NO_ANSWER] += 1
                    continue
                wrong = answer.status_code == 200 and answer.json() != {"predictions": [2, 3]}
                self.outcomes[WRONG_ANSWER if wrong else answer.status_code] += 1

    def __enter__(self) -> SteadyLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
