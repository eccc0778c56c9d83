"""A lean HTTP/1.1 load generator over loopback keep-alive connections (`connections`).

The load generator shares the machine's cores with the server, so its own CPU time is measured
and reported beside what the server did.

Two shapes of load:
- closed loop: `concurrency` clients, each sends its next request when the previous answer
  arrives (throughput at a given number of users; hides queueing, since slow answers slow the
  arrivals);
- open loop: requests arrive when they are due (at any given times, such as a Poisson process,
  evenly spaced or bursts: `arrivals`) whatever the answers do, and latency counts from the moment a
  request was due, so a server that falls behind shows it (no coordinated omission).

Any HTTP/1.1 endpoint can be driven: `Request` is the bytes sent, nothing here knows batchd.
A `Poller` reads an endpoint (`/metrics`, `/load`) on a connection of its own while a load runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvloop

from batchd.bench.kit.connections import Connection, ConnectionPool, Request, RequestFailed, Session
from batchd.bench.kit.periodic import Periodic

__all__ = [
    "Connection",
    "Poller",
    "Request",
    "RunResult",
    "closed_loop",
    "fixed_count",
    "run",
    "scheduled_loop",
]


@dataclass
class RunResult:
    """What one load run saw from the client side."""

    mode: str  # "closed" | "open"
    concurrency: int  # clients (closed) or connection cap (open)
    rate_rps: float | None  # offered arrival rate (open loop only)
    duration_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    client_cpu_s: float = 0.0
    offered: int = 0  # requests sent in the measured part (open loop)
    last_answer_s: float = 0.0  # when the last measured answer came, from the start (open loop)
    answered_due_s: list[float] = field(default_factory=list)  # when each of latencies_s was due (open loop)
    refused: int = 0  # of the errors, the 503s (open loop)
    answered_s: list[float] = field(default_factory=list)  # when each of latencies_s came (closed loop)
    answered_by: list[int] = field(default_factory=list)  # which client each of answered_s came to

    @property
    def completed(self) -> int:
        return len(self.latencies_s)

    @property
    def throughput_rps(self) -> float:
        return self.completed / self.duration_s if self.duration_s else 0.0

    @property
    def steady_rps(self) -> float:
        """Answers a second, each client's own rate summed: a client's answers after its first in
        the window, over the time from its first to its last. It resolves finer than the count over
        the window, which moves a whole round at a time where every request takes as long; and,
        client by client, a round is counted once, where the first to last answer of all clients
        together would count one round more than the time between them holds. A client with fewer
        than two answers adds its count over the window."""
        times: dict[int, list[float]] = {}
        for client, at in zip(self.answered_by, self.answered_s, strict=True):
            times.setdefault(client, []).append(at)
        if not any(len(answers) > 1 for answers in times.values()):
            return self.throughput_rps
        total = 0.0
        for answers in times.values():
            span = max(answers) - min(answers)
            if len(answers) > 1 and span > 0:
                total += (len(answers) - 1) / span
            elif self.duration_s:
                total += len(answers) / self.duration_s
        return total

    def record_error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what)


async def closed_loop(
    host: str,
    port: int,
    request: Request,
    concurrency: int,
    duration_s: float,
    warmup_s: float = 0.0,
    stagger_s: float = 0.0,
    at_window: Callable[[], None] | None = None,
) -> RunResult:
    """`concurrency` clients, each on its own connection, for `duration_s` after `warmup_s`; client
    i starts i/concurrency of `stagger_s` late (within the warm-up), so that clients whose
    requests all take as long are spread over a round rather than in step. `at_window` is called
    when the measured window opens (to read the server's CPU there, say)."""
    result = RunResult("closed", concurrency, None)
    start = time.perf_counter()
    measure_from = start + warmup_s
    stop_at = measure_from + duration_s
    window = asyncio.get_running_loop().call_later(warmup_s, at_window) if at_window is not None else None

    async def client(index: int) -> None:
        await asyncio.sleep(stagger_s * index / concurrency)
        session = Session(host, port)
        while True:
            now = time.perf_counter()
            if now >= stop_at:
                break
            try:
                status, body = await session.send(request)
            except RequestFailed as error:
                if time.perf_counter() >= measure_from:
                    result.record_error(str(error))
                continue
            done = time.perf_counter()
            if done < measure_from:
                continue
            if done > stop_at:
                break  # finished after the window: counted neither as done nor as lost
            if status == 200:
                result.latencies_s.append(done - now)
                result.answered_s.append(done - measure_from)
                result.answered_by.append(index)
            else:
                result.record_error(f"HTTP {status}: {body[:200]!r}")
        session.close()

    cpu_before = time.process_time()
    await asyncio.gather(*(client(index) for index in range(concurrency)))
    if window is not None:
        window.cancel()
    result.client_cpu_s = time.process_time() - cpu_before
    result.duration_s = duration_s
    return result


async def scheduled_loop(
    host: str,
    port: int,
    request: Request,
    dues_s: Sequence[float],
    *,
    measure_from_s: float = 0.0,
    measured_s: float = 0.0,
    max_connections: int = 512,
    grace_s: float = 10.0,
    start: float | None = None,
) -> RunResult:
    """One request due at each of `dues_s` (seconds from `start`, ascending); latency counts from
    when each was due. Requests due before `measure_from_s` warm up and are not counted.

    Connections come from a pool that grows up to `max_connections`; an arrival that finds none
    free waits for one, and that wait counts in its latency, as it would for a real user. A
    request on a reused connection that the server closed while it sat idle (its keep-alive
    timeout) goes once more on a new one. Requests still unanswered `grace_s` after the last one
    was due are given up and counted as errors: an overloaded server's backlog would otherwise
    stretch the run without bound. The duration is `measured_s`, or until the last answer came.
    """
    result = RunResult("open", max_connections, None)
    pool = ConnectionPool(host, port, max_connections)
    began = time.perf_counter() if start is None else start

    async def one(due_s: float) -> None:
        measured = due_s >= measure_from_s
        for attempt in range(2):
            connection = None
            reused = False
            try:
                connection, reused = await pool.take()
                status, body = await connection.call(request)
                break
            except (OSError, asyncio.IncompleteReadError, ValueError) as error:
                if connection is not None:
                    connection.close()
                    await pool.give_back(None)
                stale = reused and isinstance(error, asyncio.IncompleteReadError | ConnectionResetError)
                if attempt == 0 and stale:
                    continue
                if measured:
                    result.record_error(f"{type(error).__name__}: {error}")
                return
        await pool.give_back(connection)
        done_s = time.perf_counter() - began
        if not measured:
            return
        if status == 200:
            result.latencies_s.append(done_s - due_s)
            result.answered_due_s.append(due_s)
            result.last_answer_s = max(result.last_answer_s, done_s)
        else:
            result.refused += status == 503
            result.record_error(f"HTTP {status}: {body[:200]!r}")

    cpu_before = time.process_time()
    tasks = []
    for due_s in dues_s:
        delay = began + due_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        result.offered += due_s >= measure_from_s
        tasks.append(asyncio.ensure_future(one(due_s)))
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=grace_s)
        for task in late:
            task.cancel()
        for _ in late:
            result.record_error(f"no answer within {grace_s} s after the last arrival")
        await asyncio.gather(*late, return_exceptions=True)
    result.duration_s = max(measured_s, result.last_answer_s - measure_from_s)
    result.client_cpu_s = time.process_time() - cpu_before
    pool.close()
    return result


class Poller(Periodic):
    """GET `path` on a connection of its own while a load runs (see `Periodic`); keeps (seconds
    since `start`, body) of every answer 200."""

    def __init__(
        self,
        host: str,
        port: int,
        path: str,
        every_s: float,
        *,
        delay_s: float = 0.0,
        start: float | None = None,
    ) -> None:
        super().__init__(every_s, delay_s=delay_s, start=start)
        self.host, self.port = host, port
        self.request = Request.get(host, port, path)
        self.samples: list[tuple[float, bytes]] = []
        self._connection: Connection | None = None

    async def open(self) -> None:
        self._connection = await Connection.open(self.host, self.port)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()

    async def tick(self, at: float) -> None:
        if self._connection is None or not self._connection.reusable:
            await self.open()
        assert self._connection is not None
        status, body = await self._connection.call(self.request)
        if status == 200:
            self.samples.append((at, body))


def run(load: Coroutine[Any, Any, RunResult]) -> RunResult:
    """Run a load coroutine on uvloop (installed with uvicorn[standard]): a cheaper event loop."""
    return uvloop.run(load)


async def fixed_count(host: str, port: int, requests: list[Request], concurrency: int) -> RunResult:
    """Send every request in `requests` once, `concurrency` at a time (closed loop); for the demo."""
    result = RunResult("closed", concurrency, None)
    pending = iter(requests)

    async def client() -> None:
        session = Session(host, port)
        for request in pending:  # the iterator is shared: each request goes out once
            sent = time.perf_counter()
            try:
                status, body = await session.send(request)
            except RequestFailed as error:
                result.record_error(str(error))
                continue
            if status == 200:
                result.latencies_s.append(time.perf_counter() - sent)
            else:
                result.record_error(f"HTTP {status}: {body[:200]!r}")
        session.close()

    cpu_before = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    result.duration_s = time.perf_counter() - started
    result.client_cpu_s = time.process_time() - cpu_before
    return result
