"""Open-loop traffic over a Service's endpoints, with every request's outcome kept.

Requests arrive at the rate asked for whatever the answers do (a user does not wait for the
previous user), each goes to the next ready endpoint at the moment it is sent (as kube-proxy
routes a new connection), over a real keep-alive client (aiohttp). Nothing is hidden: a
request that got no HTTP answer (reset, refused, timed out) is an outcome like a 200, so a
test can assert that none was lost.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp

Rate = float | Callable[[float], float]  # requests per second, or a function of the elapsed seconds
ERROR_CHARS = 200  # of an error answer's body, kept to say who refused a request and why


@dataclass(frozen=True)
class Outcome:
    sent_s: float  # since the run started
    latency_s: float
    endpoint: str
    status: int | None  # None: no HTTP answer at all
    retry_after: str | None = None
    error: str = ""  # why no answer came, or what an answer other than a 2xx said (its start)

    @property
    def answered(self) -> bool:
        """An answer a well-behaved client can act on: a 2xx, or a 503/429 that says when to retry."""
        if self.status is not None and 200 <= self.status < 300:
            return True
        return self.status in (429, 503) and self.retry_after is not None


@dataclass
class Traffic:
    """One open-loop run; `outcomes` fills in as answers come back."""

    endpoints: Callable[[], Sequence[str]]
    path: str
    body: bytes
    rate: Rate
    timeout_s: float = 30.0
    # At most this many connections, kept alive and reused, as a client's pool does (a replica
    # that becomes ready later gets none of them); 0: a new connection rather than a queue.
    connections: int = 0
    headers: Mapping[str, str] = field(default_factory=dict)  # sent with every request
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def stop(self) -> None:
        self._stop.set()

    def rate_at(self, elapsed_s: float) -> float:
        return self.rate(elapsed_s) if callable(self.rate) else self.rate

    async def run(self, duration_s: float, start: float | None = None) -> list[Outcome]:
        """Send until `duration_s` has passed or `stop()`; then wait (bounded) for every answer.
        Times are from `start` (time.perf_counter(); now when not given)."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        connector = aiohttp.TCPConnector(limit=self.connections)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            started = time.perf_counter() if start is None else start
            turn = itertools.count()
            pending: set[asyncio.Task[None]] = set()
            due = 0.0
            while due < duration_s and not self._stop.is_set():
                delay = started + due - time.perf_counter()
                if delay > 0:
                    try:
                        await asyncio.wait_for(self._stop.wait(), delay)
                        break
                    except TimeoutError:
                        pass
                task = asyncio.create_task(self._one(session, started, next(turn)))
                pending.add(task)
                task.add_done_callback(pending.discard)
                due += 1.0 / max(self.rate_at(due), 1e-3)
            if pending:
                await asyncio.wait(pending, timeout=self.timeout_s + 5)
        return self.outcomes

    async def _one(self, session: aiohttp.ClientSession, started: float, turn: int) -> None:
        sent = time.perf_counter()
        endpoints = list(self.endpoints())
        if not endpoints:
            self.outcomes.append(Outcome(sent - started, 0.0, "", None, error="no ready endpoint"))
            return
        endpoint = endpoints[turn % len(endpoints)]
        try:
            async with session.post(
                f"{endpoint}{self.path}",
                data=self.body,
                headers={"Content-Type": "application/json", **self.headers},
            ) as response:
                body = await response.read()
                outcome = Outcome(
                    sent - started,
                    time.perf_counter() - sent,
                    endpoint,
                    response.status,
                    response.headers.get("Retry-After"),
                    "" if response.status < 300 else body[:ERROR_CHARS].decode("utf-8", "replace"),
                )
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            outcome = Outcome(
                sent - started,
                time.perf_counter() - sent,
                endpoint,
                None,
                error=f"{type(error).__name__}: {error}",
            )
        self.outcomes.append(outcome)


def unanswered(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """The outcomes a client could not act on: no answer, or an error that is not a retry hint."""
    return [outcome for outcome in outcomes if not outcome.answered]
