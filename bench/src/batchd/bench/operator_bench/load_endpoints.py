"""Stand-in load endpoints: one lightweight process answers `GET /load` on the address of every
stand-in replica pod, so that what is measured is the operator's own cost of polling them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import time
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import ClassVar, cast

from batchd.api.pod import REPLICA_PORT
from batchd.bench.kit.connections import Connection, Request


def replica_ip(index: int) -> str:
    """The stand-in pod addresses: 127.200.0.1 upwards, on this machine's loopback device."""
    return f"127.200.{index // 250}.{index % 250 + 1}"


def stand_in_load(address: str, now: float) -> tuple[int, int]:
    """(queued, running) items a replica at `address` reports at `now`: each replica its own base
    load (0-11 items), moving +-30% over two minutes, so that some polls change a resource's total
    by more than the operator's 10% write threshold and others do not."""
    seed = zlib.crc32(address.encode())
    base = seed % 12
    items = round(base * (1 + 0.3 * math.sin(2 * math.pi * now / 120 + seed % 628 / 100)))
    running = min(items, 8)
    return items - running, running


class _LoadEndpoints(asyncio.Protocol):
    """One connection to a stand-in replica: HTTP/1.1 keep-alive GETs, answered from memory."""

    # (wall time, address) of every GET /load, for the report: one list for every connection.
    polls: ClassVar[list[tuple[float, str]]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's, which does not subclass asyncio's
        self.address = str(transport.get_extra_info("sockname")[0])  # which "pod" was asked
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
            path = head.split(b" ", 2)[1]
            if path == b"/load":
                now = time.time()
                self.polls.append((now, self.address))
                queued, running = stand_in_load(self.address, now)
                body = json.dumps(
                    {
                        "ready": True,
                        "queued_items": queued,
                        "running_items": running,
                        "inflight_requests": queued + running,
                        "batching_revision": 1,  # a new resource's generation, as its replicas run it
                    }
                ).encode()
            elif path == b"/polls":  # the benchmark's own question: every poll so far
                body = json.dumps(self.polls).encode()
            else:
                body = b"{}"
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )


def serve_loads(count: int, port: int = REPLICA_PORT) -> None:
    """Answer `GET /load` on the first `count` stand-in addresses until killed (its own process)."""
    import uvloop

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        hosts = [replica_ip(index) for index in range(count)]
        server = await loop.create_server(_LoadEndpoints, host=hosts, port=port, backlog=1024)
        print("listening", flush=True)
        async with server:
            await server.serve_forever()

    uvloop.run(serve())


@contextlib.asynccontextmanager
async def load_server(count: int, log: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    code = f"from batchd.bench.operator_bench.load_endpoints import serve_loads; serve_loads({count})"
    with log.open("w") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=stderr
        )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 60)
        if line.strip() != b"listening":
            raise RuntimeError(f"the stand-in load endpoints did not start; see {log}")
        yield process
    finally:
        process.kill()
        await process.wait()


async def polls_seen() -> list[tuple[float, str]]:
    """Every `GET /load` the stand-in endpoints answered so far: (when, which address)."""
    connection = await Connection.open(replica_ip(0), REPLICA_PORT)
    try:
        _, body = await connection.call(Request.get(replica_ip(0), REPLICA_PORT, "/polls"))
        return [(t, address) for t, address in json.loads(body)]
    finally:
        connection.close()
