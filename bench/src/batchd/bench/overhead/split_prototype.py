"""A prototype, not a product: uvicorn front processes feeding one model process that batches.

Mosec and Triton answer HTTP in one place and run the model in another. This measures what that
shape would cost batchd before anyone builds it: `--fronts` uvicorn processes (httptools, the
replica's own connection protocol, a raw ASGI app, one listening port shared with SO_REUSEPORT)
each send the items of the requests that arrived in one turn of their event loop to the model
process in one message over a Unix socket; the model process gathers items from every front
into batches (max 32, 10 ms wait, as the replica's `batching`) and sends each front its results.
No deadlines, no disconnect watch, no metrics, no validation: a lower bound for the shape.

    python -m batchd.bench.overhead.split_prototype --host 127.0.0.1 --port 8000 --fronts 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import uvicorn
import uvloop

from batchd.bench.kit.asgi import read_body
from batchd.bench.overhead.subjects import BATCH_WAIT_S, MAX_BATCH_SIZE
from batchd.replica.front.keepalive import bounded_protocol

FRAME = struct.Struct("!I")  # every message: its length, then orjson of [[request id, item], ...]
MODULE = "batchd.bench.overhead.split_prototype"


async def _read_frame(reader: asyncio.StreamReader) -> Any:
    (length,) = FRAME.unpack(await reader.readexactly(FRAME.size))
    return orjson.loads(await reader.readexactly(length))


def _frame(value: Any) -> bytes:
    body = orjson.dumps(value)
    return FRAME.pack(len(body)) + body


async def serve_model(path: str) -> None:
    """The model process: batches items from every front, runs the adder, answers each front."""
    queue: list[tuple[asyncio.StreamWriter, int, int]] = []
    arrived = asyncio.Event()

    async def form_batches() -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not queue:
                arrived.clear()
                await arrived.wait()
            closes = loop.time() + BATCH_WAIT_S
            while len(queue) < MAX_BATCH_SIZE and loop.time() < closes:
                arrived.clear()
                try:
                    async with asyncio.timeout_at(closes):
                        await arrived.wait()
                except TimeoutError:
                    break
            batch = queue[:MAX_BATCH_SIZE]
            del queue[:MAX_BATCH_SIZE]
            answers: dict[asyncio.StreamWriter, list[tuple[int, int]]] = {}
            for writer, request, item in batch:
                answers.setdefault(writer, []).append((request, item + 1))  # the adder
            for writer, results in answers.items():
                writer.write(_frame(results))

    async def from_front(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                items = await _read_frame(reader)
            except asyncio.IncompleteReadError:
                return
            queue.extend((writer, request, item) for request, item in items)
            arrived.set()

    former = asyncio.create_task(form_batches())
    server = await asyncio.start_unix_server(from_front, path)
    async with server:
        await server.serve_forever()
    former.cancel()


class Front:
    """One front process's ASGI app: the request's items go to the model process, and the answer
    waits for their results."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.writer: asyncio.StreamWriter | None = None
        self.outgoing: list[tuple[int, int]] = []
        self.waiting: dict[int, asyncio.Future[int]] = {}
        self.next_id = 0
        self.reader_task: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        reader, self.writer = await asyncio.open_unix_connection(self.path)
        self.reader_task = asyncio.create_task(self._results(reader))

    async def _results(self, reader: asyncio.StreamReader) -> None:
        while True:
            for request, result in await _read_frame(reader):
                future = self.waiting.pop(request, None)
                if future is not None and not future.done():
                    future.set_result(result)

    def _send(self) -> None:
        assert self.writer is not None
        self.writer.write(_frame(self.outgoing))
        self.outgoing = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await self.connect()
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await read_body(receive)
        answer = b"{}"  # a GET: the readiness probe
        if scope["method"] == "POST":
            loop = asyncio.get_running_loop()
            futures = []
            if not self.outgoing:  # the first of this turn: they all leave together at its end
                loop.call_soon(self._send)
            for item in orjson.loads(body)["instances"]:
                future: asyncio.Future[int] = loop.create_future()
                self.waiting[self.next_id] = future
                self.outgoing.append((self.next_id, item))
                self.next_id += 1
                futures.append(future)
            answer = orjson.dumps({"predictions": [await future for future in futures]})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


def run_front(host: str, port: int, path: str) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind((host, port))
    listener.listen(4096)
    config = uvicorn.Config(
        Front(path),
        fd=listener.fileno(),
        http=bounded_protocol(0, 0),
        loop="uvloop",
        log_level="warning",
        access_log=False,
        timeout_keep_alive=75,
    )
    uvicorn.Server(config).run()


def stop_all(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        child.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--fronts", type=int, default=1)
    parser.add_argument("--role", choices=("launcher", "model", "front"), default="launcher")
    parser.add_argument("--socket", default=None)
    args = parser.parse_args()
    if args.role == "model":
        uvloop.run(serve_model(args.socket))
        return
    if args.role == "front":
        run_front(args.host, args.port, args.socket)
        return
    with tempfile.TemporaryDirectory(prefix="batchd-split-") as scratch:
        path = str(Path(scratch) / "model.sock")
        own = [sys.executable, "-m", MODULE, "--socket", path]
        children = [subprocess.Popen([*own, "--role", "model"])]
        deadline = time.monotonic() + 30
        while not os.path.exists(path):  # the model process binds at once, or has failed
            if children[0].poll() is not None or time.monotonic() > deadline:
                stop_all(children)
                sys.exit("the model process did not listen")
            time.sleep(0.01)
        front = [*own, "--role", "front", "--host", args.host, "--port", str(args.port)]
        children += [subprocess.Popen(front) for _ in range(args.fronts)]
        signal.signal(signal.SIGTERM, lambda *_: stop_all(children))
        for child in children:
            child.wait()


if __name__ == "__main__":
    main()
