"""A lean HTTP/1.1 load generator: raw asyncio streams over loopback keep-alive connections.

The load generator shares this machine's two cores with the server, so every microsecond it
spends is one the server does not get. A full client library (httpx) costs several times more
CPU per request than this; here a request is one pre-encoded `bytes` write and a response is
one header read plus one body read. The load generator's own CPU time is measured and reported.

Two shapes of load:
- closed loop: `concurrency` clients, each sends its next request when the previous answer
  arrives (throughput at a given number of users; hides queueing, since slow answers slow the
  arrivals);
- open loop: requests arrive at a fixed rate whatever the answers do, and latency counts from
  the moment a request was due, so a server that falls behind shows it (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import uvloop


@dataclass(frozen=True)
class Request:
    """One pre-encoded request, sent as is on every call."""

    raw: bytes

    @classmethod
    def post_json(cls, host: str, port: int, path: str, body: bytes) -> Request:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return cls(head.encode("latin-1") + body)

    @classmethod
    def get(cls, host: str, port: int, path: str) -> Request:
        return cls(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode("latin-1"))


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

    @property
    def completed(self) -> int:
        return len(self.latencies_s)

    @property
    def throughput_rps(self) -> float:
        return self.completed / self.duration_s if self.duration_s else 0.0

    def record_error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what)


class Connection:
    """One keep-alive HTTP/1.1 connection; `call` sends a request and returns (status, body)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def call(self, request: Request) -> tuple[int, bytes]:
        self.writer.write(request.raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status, length, chunked = parse_head(head)
        if chunked:
            body = await self._read_chunked()
        else:
            body = await self.reader.readexactly(length) if length else b""
        return status, body

    async def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int((await self.reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
            if size == 0:
                await self.reader.readuntil(b"\r\n")
                return b"".join(parts)
            parts.append(await self.reader.readexactly(size + 2))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


def parse_head(head: bytes) -> tuple[int, int, bool]:
    """Status code, Content-Length (0 if absent) and whether the body is chunked."""
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = 0
    chunked = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        lowered = name.strip().lower()
        if lowered == b"content-length":
            length = int(value.strip())
        elif lowered == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    return status, length, chunked


class RequestFailed(Exception):
    """A request got no HTTP answer (connection refused, reset, or a malformed reply)."""


class _Session:
    """One client's keep-alive connection, opened on first use and reopened after a failure."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.connection: Connection | None = None

    async def send(self, request: Request) -> tuple[int, bytes]:
        try:
            if self.connection is None:
                self.connection = await Connection.open(self.host, self.port)
            return await self.connection.call(request)
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:
            self.close()
            raise RequestFailed(f"{type(error).__name__}: {error}") from error

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


async def closed_loop(
    host: str, port: int, request: Request, concurrency: int, duration_s: float, warmup_s: float = 0.0
) -> RunResult:
    """`concurrency` clients, each on its own connection, for `duration_s` after `warmup_s`."""
    result = RunResult("closed", concurrency, None)
    start = time.perf_counter()
    measure_from = start + warmup_s
    stop_at = measure_from + duration_s

    async def client() -> None:
        session = _Session(host, port)
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
            else:
                result.record_error(f"HTTP {status}: {body[:200]!r}")
        session.close()

    cpu_before = time.process_time()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    result.client_cpu_s = time.process_time() - cpu_before
    result.duration_s = duration_s
    return result


class ConnectionPool:
    """Keep-alive connections for an open loop: grows up to `max_connections`; a request that
    finds none free waits for one (and that wait counts in its latency, as it would for a user)."""

    def __init__(self, host: str, port: int, max_connections: int) -> None:
        self.host, self.port, self.max_connections = host, port, max_connections
        self._idle: list[Connection] = []
        self._opened = 0
        self._freed = asyncio.Condition()

    async def take(self) -> tuple[Connection, bool]:
        """A connection, and whether it was used before (the server may have closed it since)."""
        async with self._freed:
            while not self._idle and self._opened >= self.max_connections:
                await self._freed.wait()
            if self._idle:
                return self._idle.pop(), True
            self._opened += 1
        try:
            return await Connection.open(self.host, self.port), False
        except OSError:
            async with self._freed:
                self._opened -= 1
                self._freed.notify()
            raise

    async def give_back(self, connection: Connection | None) -> None:
        """Return a connection for the next request; None for one that was closed after an error."""
        async with self._freed:
            if connection is None:
                self._opened -= 1
            else:
                self._idle.append(connection)
            self._freed.notify()

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()


async def open_loop(
    host: str,
    port: int,
    request: Request,
    rate_rps: float,
    duration_s: float,
    max_connections: int = 512,
    grace_s: float = 10.0,
) -> RunResult:
    """Requests due every 1/rate_rps seconds for `duration_s`; latency counts from when each was due.

    Connections come from a pool that grows up to `max_connections`; an arrival that finds none
    free waits for one, and that wait counts in its latency, as it would for a real user.
    Requests still unanswered `grace_s` after the last one was due are given up and counted as
    errors: an overloaded server's backlog would otherwise stretch the run without bound.
    """
    result = RunResult("open", max_connections, rate_rps)
    pool = ConnectionPool(host, port, max_connections)

    async def one(due: float) -> None:
        connection = None
        try:
            connection, _ = await pool.take()
            status, body = await connection.call(request)
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:
            if connection is not None:
                connection.close()
                await pool.give_back(None)
            result.record_error(f"{type(error).__name__}: {error}")
            return
        await pool.give_back(connection)
        if status == 200:
            result.latencies_s.append(time.perf_counter() - due)
        else:
            result.record_error(f"HTTP {status}: {body[:200]!r}")

    cpu_before = time.process_time()
    start = time.perf_counter()
    interval = 1.0 / rate_rps
    total = int(rate_rps * duration_s)
    tasks = []
    for index in range(total):
        due = start + index * interval
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(due)))
    _, late = await asyncio.wait(tasks, timeout=grace_s)
    for task in late:
        task.cancel()
    for _ in late:
        result.record_error(f"no answer within {grace_s} s after the last arrival")
    await asyncio.gather(*late, return_exceptions=True)
    result.duration_s = max(time.perf_counter() - start, duration_s)
    result.client_cpu_s = time.process_time() - cpu_before
    pool.close()
    return result


def run(load: Coroutine[Any, Any, RunResult]) -> RunResult:
    """Run a load coroutine on uvloop (installed with uvicorn[standard]): a cheaper event loop."""
    return uvloop.run(load)


async def fixed_count(host: str, port: int, requests: list[Request], concurrency: int) -> RunResult:
    """Send every request in `requests` once, `concurrency` at a time (closed loop); for the demo."""
    result = RunResult("closed", concurrency, None)
    pending = iter(requests)

    async def client() -> None:
        session = _Session(host, port)
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
