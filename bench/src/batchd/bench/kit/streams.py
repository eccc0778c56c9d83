"""One streamed answer (Server-Sent Events over aiohttp), read to its end: every benchmark that
measures a time to first token sends through here, so that the time means the same in each; and
the open loop that sends them when they are due.

What came is kept as it came: each event's payload (the text after `data: `) with the moment it
arrived (the event loop's clock), the status and the headers. Reading it (where the text is, what
the last event says) is the protocol's business, and the benchmark's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

T = TypeVar("T")
R = TypeVar("R")
DATA = b"data: "
ERROR_CHARS = 200  # of an error answer's body: enough to say who refused and why


@dataclass(frozen=True)
class Streamed:
    """An answer as it streamed: `status` None where no HTTP answer came, `done_s` None where it
    broke off (then `error` says how)."""

    status: int | None
    events: list[tuple[float, bytes]] = field(default_factory=list)  # (arrived, payload)
    done_s: float | None = None
    error: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def first_s(self) -> float | None:
        """When the first event came."""
        return self.events[0][0] if self.events else None

    @property
    def last(self) -> bytes:
        """The last event's payload (b"" where none came)."""
        return self.events[-1][1] if self.events else b""


async def stream(
    session: aiohttp.ClientSession, url: str, body: Any, headers: Mapping[str, str] | None = None
) -> Streamed:
    """POST `body` (JSON, or bytes as they are), its answer read event by event to its end."""
    loop = asyncio.get_running_loop()
    sent = {"json": body} if not isinstance(body, bytes) else {"data": body}
    events: list[tuple[float, bytes]] = []
    status = None
    answer_headers: Mapping[str, str] = {}
    try:
        async with session.post(url, headers=headers, **sent) as response:
            status, answer_headers = response.status, response.headers
            if status != 200:
                text = (await response.text())[:ERROR_CHARS]
                return Streamed(status, error=f"{status}: {text}", headers=answer_headers)
            async for line in response.content:
                if line.startswith(DATA):
                    events.append((loop.time(), line[len(DATA) :].rstrip()))
    except (aiohttp.ClientError, TimeoutError) as error:
        failed = f"{type(error).__name__}: {error}"
        return Streamed(status, events, error=failed, headers=answer_headers)
    return Streamed(status, events, loop.time(), headers=answer_headers)


async def open_loop(
    timed: Iterable[tuple[float, T]], send: Callable[[float, float, T], Awaitable[R]], lead_s: float = 0.1
) -> list[R]:
    """Each item sent when it is due, whatever the answers do: `send(start, due_s, item)`, `due_s`
    seconds after `start` (the loop's clock), which is `lead_s` from now so that the first is not
    late for the time it takes to schedule them all."""
    loop = asyncio.get_running_loop()
    start = loop.time() + lead_s

    async def one(due_s: float, item: T) -> R:
        await asyncio.sleep(max(0.0, start + due_s - loop.time()))
        return await send(start, due_s, item)

    return list(await asyncio.gather(*(one(due_s, item) for due_s, item in timed)))


def session(give_up_s: float, headers: Mapping[str, str] | None = None) -> aiohttp.ClientSession:
    """A client with no bound on its connections (a load sets its own), each request given up after
    `give_up_s`."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=give_up_s),
        headers=headers,
    )
