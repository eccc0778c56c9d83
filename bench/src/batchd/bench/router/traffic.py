"""The client of the measured problem: an aiohttp session with a bounded keep-alive pool, sending
at a fixed rate whatever the answers do (open loop), every request's outcome kept.

A bounded pool is what real clients use (aiohttp's default is 100 connections, here 32): once its
connections are open they are reused for as long as the server keeps them, so a replica that
becomes ready later gets none of them unless something balances requests, not connections.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp

from batchd.testing.traffic import Outcome

JSON = {"Content-Type": "application/json"}


async def keepalive_load(
    url: str,
    rate_rps: float,
    duration_s: float,
    *,
    connections: int = 32,
    timeout_s: float = 30.0,
    at: tuple[float, Callable[[], Awaitable[None]]] | None = None,
    start: float | None = None,
) -> list[Outcome]:
    """`rate_rps` requests a second for `duration_s` over at most `connections` keep-alive
    connections (0: as many as requests in flight); `at` = (seconds, action) runs the action once
    that many seconds in (a scale-up). A request not answered within `timeout_s` of being sent is
    an outcome with no status."""
    outcomes: list[Outcome] = []
    connector = aiohttp.TCPConnector(limit=connections)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        began = time.perf_counter() if start is None else start

        async def one(index: int) -> None:
            sent = time.perf_counter()
            body = b'{"instances": [%d]}' % index
            try:
                async with client.post(url, data=body, headers=JSON) as response:
                    await response.read()
                    status, retry_after = response.status, response.headers.get("Retry-After")
                    outcomes.append(
                        Outcome(sent - began, time.perf_counter() - sent, url, status, retry_after)
                    )
            except (aiohttp.ClientError, TimeoutError, OSError) as error:
                outcomes.append(
                    Outcome(sent - began, time.perf_counter() - sent, url, None, error=type(error).__name__)
                )

        tasks = []
        pending_action = at
        for index in range(int(rate_rps * duration_s)):
            due = began + index / rate_rps
            if pending_action is not None and due - began >= pending_action[0]:
                await asyncio.sleep(max(0.0, began + pending_action[0] - time.perf_counter()))
                await pending_action[1]()
                pending_action = None
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            tasks.append(asyncio.ensure_future(one(index)))
        await asyncio.gather(*tasks)
    return sorted(outcomes, key=lambda outcome: outcome.sent_s)
