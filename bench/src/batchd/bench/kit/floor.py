"""The floor for server overhead: a bare ASGI endpoint on the same uvicorn settings as batchd.

It reads the request body and answers a constant KServe V1 body at once, with no framework,
no validation and no batching: the most requests per second this uvicorn, on this machine,
can answer. `python -m batchd.bench.kit.floor --port P` serves it; batchd's overhead is quoted as
batchd's throughput over this one's. It answers `GET /load` as an idle, ready replica does, so
that a router's load poller reads it too (the router benchmark's cheapest upstream).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import uvicorn
from starlette.types import Receive, Scope, Send

from batchd.api.httpserver import UVICORN_OPTIONS
from batchd.testing import servers

ANSWER = b'{"predictions":[2]}'  # the adder's answer to the benchmarks' one item, 1
IDLE = b'{"ready": true, "queued_items": 0, "running_items": 0}'
HEADERS = [(b"content-type", b"application/json")]


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:  # drain the body, as a real endpoint must
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": IDLE if scope["path"] == "/load" else ANSWER})


def start(log_dir: Path, cores: set[int] | None = None, host: str = "127.0.0.1") -> servers.ServerProcess:
    """This floor in a process of its own, beside the replicas it is compared with (or behind a
    router, on an address a slice may hold: `host`). It answers every path, its readiness too."""
    return servers.start_process(
        "floor", [sys.executable, "-m", "batchd.bench.kit.floor"], log_dir, cores=cores, host=host
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    # The settings batchd's `serve` uses: uvloop, httptools, no proxy headers, no access log.
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False, **UVICORN_OPTIONS)


if __name__ == "__main__":
    main()
