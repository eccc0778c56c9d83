"""Which HTTP client the router uses towards replicas: aiohttp's, or a small asyncio protocol over
httptools' response parser (what `batchd.router.connections` became). Measured as this process's
CPU time per request against the trivial adder, one and `in_flight` requests in flight, the
clients taking turns within each round.

The small protocol here handles only what the comparison needs (Content-Length bodies,
keep-alive); it is measured, not used.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httptools

from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import rotated
from batchd.bench.router.analysis import ClientRound, ClientsResult
from batchd.bench.router.cost import BODY, PATH, listening, start_adder
from batchd.bench.router.options import ClientsOptions
from batchd.testing.servers import ServerProcess
from batchd.testing.waiting import eventually_async

CLIENTS = ("aiohttp", "httptools protocol")


class _Response(asyncio.Protocol):
    """One keep-alive connection: write a request, parse its answer with httptools."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[int] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        assert self.done is not None
        self.done.set_result(self.parser.get_status_code())

    def connection_lost(self, error: Exception | None) -> None:
        # The server closes a connection left idle past its keep-alive timeout.
        self.transport = None
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionResetError("the server closed the connection"))

    async def request(self, raw: bytes) -> int:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self.done


class ProtocolPool:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[_Response] = []
        self.raw = (
            f"POST {PATH} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
        ).encode() + BODY

    async def post(self) -> int:
        connection = None
        while self.idle and connection is None:
            connection = self.idle.pop()
            if connection.transport is None or connection.transport.is_closing():
                connection = None  # closed by the server while idle
        if connection is None:
            _, connection = await asyncio.get_running_loop().create_connection(
                _Response, self.host, self.port
            )
        status = await connection.request(self.raw)
        self.idle.append(connection)
        return status


async def cpu_per_request_us(post: Callable[[], Awaitable[int]], count: int, in_flight: int) -> float:
    """Microseconds of this process's CPU per request, `count` requests `in_flight` at a time."""
    pending = iter(range(count))

    async def worker() -> None:
        for _ in pending:
            status = await post()
            if status != 200:
                raise RuntimeError(f"the trivial adder answered {status}")

    started = time.process_time()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return (time.process_time() - started) / count * 1e6


async def _compare(adder: ServerProcess, options: ClientsOptions) -> list[ClientRound]:
    rounds: list[ClientRound] = []
    connector = aiohttp.TCPConnector(limit=0)
    quiet = ("User-Agent", "Accept", "Accept-Encoding")
    async with aiohttp.ClientSession(
        connector=connector, auto_decompress=False, skip_auto_headers=quiet
    ) as session:
        url = f"{adder.url}{PATH}"

        async def aiohttp_post() -> int:
            async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as response:
                await response.read()
                return response.status

        posts = dict(zip(CLIENTS, (aiohttp_post, ProtocolPool(adder.host, adder.port).post), strict=True))
        for post in posts.values():
            await cpu_per_request_us(post, 200, options.in_flight)  # warm the pools
        for repeat in range(options.repeats):
            for name in rotated(CLIENTS, repeat):
                for in_flight in (1, options.in_flight):
                    cpu_us = await cpu_per_request_us(posts[name], options.requests, in_flight)
                    rounds.append(ClientRound(repeat, name, in_flight, cpu_us))
    return rounds


async def run_clients(options: ClientsOptions, workdir: Path, meta: RunRecord) -> ClientsResult:
    adder = start_adder(workdir)
    try:
        await eventually_async(
            lambda: asyncio.to_thread(listening, adder), timeout_s=60.0, what="the trivial adder listening"
        )
        print("upstream clients", flush=True)
        rounds = await _compare(adder, options)
    finally:
        adder.stop()
    return ClientsResult(meta, dataclasses.asdict(options), rounds)
