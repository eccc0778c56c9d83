"""The measured problem, scaled down: a keep-alive client while a deployment scales from 1 to 4.

A slow adder (160 items/s a replica), one replica ready when the load starts and three more two
seconds later (the autoscaler's step), 400 requests/s from an aiohttp client with a pool of 32
keep-alive connections. Two arms, one after the other on the same replicas:
- `kube-proxy`: a TCP proxy that sends each new connection to the next ready replica, as
  kube-proxy does: connections opened before the scale-up stay on the first replica;
- `router`: the router, its endpoints from an EndpointSlice that gains the three replicas.
Reported per arm: each replica's share of the answers, and the requests with no answer within
the client's 30 s.

    .venv/bin/python router/benchmarks/scale_up.py [--seconds 8] [--rate 400]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import uvloop
from overhead import SLICES, endpoint_slice, routed

from batchd.testing.manifests import manifest
from batchd.testing.servers import ServerProcess, start_replica, write_manifest

SLOW = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": 0.05}}
BATCHING = {"max_batch_size": 8, "batch_wait_timeout_s": 0.005, "max_queued_requests": 4096}
PATH = "/v1/models/slow:predict"


def served(replica: ServerProcess) -> int:
    text = httpx.get(f"{replica.url}/metrics", timeout=5).text
    pattern = r'^batchd_requests_total\{[^}]*outcome="success"[^}]*\} (\S+)$'
    return sum(int(float(value)) for value in re.findall(pattern, text, re.M))


class ConnectionBalancer:
    """kube-proxy's part: each new connection to the next of `endpoints`, bytes both ways."""

    def __init__(self) -> None:
        self.endpoints: list[tuple[str, int]] = []
        self._turn = 0
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self.endpoints[self._turn % len(self.endpoints)]
        self._turn += 1
        upstream_reader, upstream_writer = await asyncio.open_connection(host, port)
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def open_loop(url: str, rate: float, seconds: float, scale_up: Callable[[], Any]) -> list[int | None]:
    """`rate` requests/s for `seconds` over 32 keep-alive connections; `scale_up()` at 2 s."""
    statuses: list[int | None] = []
    connector = aiohttp.TCPConnector(limit=32)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as client:

        async def one(n: int) -> None:
            try:
                async with client.post(url, json={"instances": [n]}) as response:
                    await response.read()
                    statuses.append(response.status)
            except (aiohttp.ClientError, TimeoutError):
                statuses.append(None)

        started, tasks, scaled = time.monotonic(), [], False
        for n in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
            if not scaled and time.monotonic() - started >= 2.0:
                scaled = True
                await scale_up()
            tasks.append(asyncio.create_task(one(n)))
        await asyncio.gather(*tasks)
    return statuses


async def measure(args: argparse.Namespace, logs: Path) -> None:
    path = write_manifest(logs, manifest("slow", SLOW, batching=BATCHING))
    replicas = [start_replica(path, logs, name=f"slow-{n}") for n in range(4)]
    try:
        for replica in replicas:
            await asyncio.to_thread(replica.wait_ready, 180)
        await _arm("kube-proxy", args, replicas, logs)
        await _arm("router", args, replicas, logs)
    finally:
        for replica in replicas:
            replica.stop()


async def _arm(name: str, args: argparse.Namespace, replicas: list[ServerProcess], logs: Path) -> None:
    before = [served(replica) for replica in replicas]
    if name == "kube-proxy":
        balancer = ConnectionBalancer()
        await balancer.start()
        balancer.endpoints = [(replicas[0].host, replicas[0].port)]

        async def scale_up() -> None:
            balancer.endpoints = [(replica.host, replica.port) for replica in replicas]

        try:
            statuses = await open_loop(
                f"http://127.0.0.1:{balancer.port}{PATH}", args.rate, args.seconds, scale_up
            )
        finally:
            await balancer.close()
    else:
        statuses = await _through_router(args, replicas, logs)
    shares = [
        (served(replica) - done) / max(1, len(statuses))
        for replica, done in zip(replicas, before, strict=True)
    ]
    lost = sum(status is None for status in statuses)
    print(
        f"{name:10} shares {', '.join(f'{share:.0%}' for share in shares)}; "
        f"statuses {sorted({str(s) for s in statuses})}; no answer within 30 s: {lost} of {len(statuses)} "
        f"({lost / len(statuses):.1%})"
    )


async def _through_router(
    args: argparse.Namespace, replicas: list[ServerProcess], logs: Path
) -> list[int | None]:
    async with routed(logs, "slow", replicas[:1]) as (api, router):

        async def scale_up() -> None:
            for replica in replicas[1:]:
                await api.post(SLICES, json=endpoint_slice("slow", replica))

        return await open_loop(f"{router.url}{PATH}", args.rate, args.seconds, scale_up)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rate", type=float, default=400.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as logs:
        uvloop.run(measure(args, Path(logs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
