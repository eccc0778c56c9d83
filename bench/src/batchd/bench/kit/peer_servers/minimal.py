"""A bound, not a product: the least a dynamic-batching server on uvicorn does per request.

It runs what batchd's replica runs under every request (uvicorn with httptools and the replica's
own connection protocol, one write per answer, the model off the event loop in a thread of its
own, everything loaded frozen out of the collector's sight) and nothing else: read the body,
decode it, queue one future, batch (max 32, 10 ms wait, as the replica's `batching`), encode the
answer. No validation, no deadlines or disconnect watch, no admission bound, no metrics, no
routes besides its one. What batchd costs beyond it is what those cost; what it costs is what
any server that batches on uvicorn pays.

    python -m batchd.bench.kit.peer_servers.minimal --host 127.0.0.1 --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import uvicorn

from batchd.api.httpserver import UVICORN_OPTIONS
from batchd.bench.kit.peer_servers.servers.models import BATCH_WAIT_S, MAX_BATCH_SIZE
from batchd.replica.front.keepalive import bounded_protocol
from batchd.testing.asgi import read_body

HEADERS = [(b"content-type", b"application/json")]
READY = b'{"ready": true}'


def add_one(numbers: list[int]) -> list[int]:
    return [n + 1 for n in numbers]


class Batches:
    """Items with their futures, in batches of MAX_BATCH_SIZE or what came within BATCH_WAIT_S,
    each run on the model's thread; its results are set back on the event loop."""

    def __init__(self) -> None:
        self.model = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        self.waiting: list[tuple[Any, asyncio.Future[Any]]] = []
        self.timer: asyncio.TimerHandle | None = None

    def add(self, item: Any) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.waiting.append((item, future))
        if len(self.waiting) >= MAX_BATCH_SIZE:
            self.flush()
        elif self.timer is None:
            self.timer = loop.call_later(BATCH_WAIT_S, self.flush)
        return future

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        batch, self.waiting = self.waiting, []
        running = asyncio.get_running_loop().run_in_executor(self.model, add_one, [item for item, _ in batch])

        def answer(done: asyncio.Future[list[Any]]) -> None:
            for (_, future), result in zip(batch, done.result(), strict=True):
                if not future.done():
                    future.set_result(result)

        running.add_done_callback(answer)


BATCHES = Batches()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            gc.freeze()  # as the replica, once loaded
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = await read_body(receive)
    if scope["path"] == "/load":  # the readiness the benchmark waits on
        answer = READY
    else:
        answer = orjson.dumps({"predictions": [await BATCHES.add(orjson.loads(body)["instances"][0])]})
    headers = [*HEADERS, (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    options = {**UVICORN_OPTIONS, "http": bounded_protocol(0, 0)}
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False, **options)


if __name__ == "__main__":
    main()
