"""Bounded polls: how a test waits for something another process does, never by sleeping a guess."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

import httpx

T = TypeVar("T")

# One client for every readiness probe: a new httpx client loads the CA bundle (about 60 ms of CPU),
# which a probe every 20 ms would spend without pause, taken from the process it waits for. It keeps
# no connection open: a server's graceful stop waits a second for an idle one to close.
_PROBES = httpx.Client(timeout=1.0, limits=httpx.Limits(max_keepalive_connections=0))


def answers_ok(url: str) -> bool:
    """Whether `url` answers 200 now (a refused, reset or timed-out request is a no)."""
    try:
        return _PROBES.get(url).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass(frozen=True)
class NotYet:
    """A probe's answer while the condition does not hold, carrying what it saw there, so that a
    wait that times out says why (a bare False says nothing)."""

    seen: str

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return self.seen


def eventually(
    probe: Callable[[], T | Literal[False] | NotYet | None],
    *,
    what: str,
    timeout_s: float = 30.0,
    interval_s: float = 0.1,
) -> T:
    """Call `probe` until it returns something truthy, and return that; after `timeout_s`, fail
    saying what was awaited and what was last seen."""
    deadline = time.monotonic() + timeout_s
    last = probe()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last seen: {last!r}")
        time.sleep(interval_s)
        last = probe()
    assert last is not None and last is not False and not isinstance(last, NotYet)
    return last


@overload
async def eventually_async(
    probe: Callable[[], Awaitable[T]], *, what: str, timeout_s: float = ..., interval_s: float = ...
) -> T: ...
@overload
async def eventually_async(
    probe: Callable[[], T], *, what: str, timeout_s: float = ..., interval_s: float = ...
) -> T: ...
async def eventually_async(
    probe: Callable[[], T | Awaitable[T]], *, what: str, timeout_s: float = 30.0, interval_s: float = 0.02
) -> T:
    """`eventually` for a test's event loop: `probe` may be a coroutine function, and the loop keeps
    running (servers in it go on answering) between polls."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        result = probe()
        last = await result if inspect.isawaitable(result) else result
        if last:
            return last  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last seen: {last!r}")
        await asyncio.sleep(interval_s)
