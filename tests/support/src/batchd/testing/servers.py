"""Real servers on loopback for tests: `batchd serve` and `batchd-router` processes, as the
benchmarks start them (`batchd.bench.kit.servers`), and uvicorn in a thread for an app built in
the test itself.

Every wait is a bounded poll; nothing sleeps to synchronise.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from batchd.bench.kit.servers import (
    ServerFailed,
    ServerProcess,
    batchd_command,
    free_port,
    is_ready,
    replica_process,
    router_command,
    running,
    start_process,
    start_replica,
    start_router,
    wait_until,
    write_manifest,
)

__all__ = [
    "ServerFailed",
    "ServerProcess",
    "batchd_command",
    "free_port",
    "is_ready",
    "replica_process",
    "router_command",
    "running",
    "start_process",
    "start_replica",
    "start_router",
    "uvicorn_in_thread",
    "wait_until",
    "write_manifest",
]


@contextmanager
def uvicorn_in_thread(
    app: Any, timeout_s: float = 120, wait_ready: bool = True, http: Any = "httptools"
) -> Iterator[str]:
    """Serve an ASGI app with a real uvicorn on a loopback port; yields its base URL once it
    listens and, with `wait_ready`, once its model is ready. `http`: uvicorn's protocol (a name
    or a class, as the replica's `batchd.replica.server.replica_protocol`)."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, loop="uvloop", http=http, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: server.started or not thread.is_alive(), timeout_s, "uvicorn start")
        if not server.started:
            raise RuntimeError("uvicorn did not start (the app's lifespan failed; see the log)")
        if wait_ready:
            wait_until(lambda: is_ready(url), timeout_s, "the replica's model ready")
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
