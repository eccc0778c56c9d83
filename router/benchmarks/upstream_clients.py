"""Which HTTP client the router uses towards replicas: aiohttp's, or a small asyncio protocol over
httptools' response parser. Measured as client CPU time per request against the trivial adder,
sequential and with 32 requests in flight, interleaved rounds, medians.

    .venv/bin/python router/benchmarks/upstream_clients.py [--requests 3000] [--rounds 5]

The small protocol handles only what this comparison needs (Content-Length bodies, keep-alive);
it is here to be measured, not used.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httptools
import uvloop

from batchd.testing.servers import ServerProcess, start_process, wait_until

HERE = Path(__file__).resolve().parent
BODY = b'{"instances": [1]}'


class _Response(asyncio.Protocol):
    """One keep-alive connection: write a request, parse its answer with httptools."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[tuple[int, bytes]] | None = None
        self.chunks: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        assert self.done is not None
        self.done.set_result((self.parser.get_status_code(), b"".join(self.chunks)))
        self.chunks = []

    async def request(self, head: bytes, body: bytes) -> tuple[int, bytes]:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(head + body)
        return await self.done


class ProtocolPool:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[_Response] = []
        self.head = (
            f"POST /v1/models/adder:predict HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
        ).encode()

    async def post(self) -> int:
        connection = self.idle.pop() if self.idle else None
        if connection is None:
            _, connection = await asyncio.get_running_loop().create_connection(
                _Response, self.host, self.port
            )
        status, _ = await connection.request(self.head, BODY)
        self.idle.append(connection)
        return status


async def _cpu_per_request(post: Callable[[], Awaitable[int]], count: int, concurrency: int) -> float:
    """Microseconds of this process's CPU per request."""
    pending = iter(range(count))

    async def worker() -> None:
        for _ in pending:
            assert await post() == 200

    started = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return (time.process_time() - started) / count * 1e6


async def compare(server: ServerProcess, count: int, rounds: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
    ) as session:
        url = f"{server.url}/v1/models/adder:predict"

        async def aiohttp_post() -> int:
            async with session.post(url, data=BODY, headers={"Content-Type": "application/json"}) as response:
                await response.read()
                return response.status

        pool = ProtocolPool(server.host, server.port)
        clients = {"aiohttp": aiohttp_post, "httptools protocol": pool.post}
        for post in clients.values():
            await _cpu_per_request(post, 200, 32)  # warm the pools
        for _ in range(rounds):
            for name, post in clients.items():
                for concurrency in (1, 32):
                    key = f"{name}, {concurrency} in flight"
                    results.setdefault(key, []).append(await _cpu_per_request(post, count, concurrency))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as logs:
        server = start_process(
            "trivial-adder",
            [
                sys.executable,
                "-m",
                "uvicorn",
                "trivial_adder:app",
                "--app-dir",
                str(HERE),
                "--loop",
                "uvloop",
                "--http",
                "httptools",
                "--no-access-log",
                "--log-level",
                "warning",
            ],
            Path(logs),
        )
        try:
            wait_until(lambda: listening(server), 30, "the trivial adder listening")
            results = uvloop.run(compare(server, args.requests, args.rounds))
        finally:
            server.stop()
    rounds = f"median of {args.rounds} interleaved rounds of {args.requests}"
    print(f"client CPU per request (microseconds), {rounds}:")
    for key, values in results.items():
        print(
            f"  {key:32} {statistics.median(values):7.1f}   (rounds: {', '.join(f'{v:.0f}' for v in values)})"
        )
    return 0


def listening(server: ServerProcess) -> bool:
    server.check_alive()
    try:
        socket.create_connection((server.host, server.port), timeout=1).close()
    except OSError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
