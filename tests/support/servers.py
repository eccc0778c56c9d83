"""Real servers on loopback for tests: uvicorn in a thread, or `batchd serve` as a process.

Every wait is a bounded poll; nothing sleeps to synchronise.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not true within {timeout_s} s")
        time.sleep(0.02)


def is_ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def uvicorn_in_thread(app: Any, timeout_s: float = 120, wait_ready: bool = True) -> Iterator[str]:
    """Serve an ASGI app with a real uvicorn on a loopback port; yields its base URL once it
    listens and, with `wait_ready`, once its model is ready."""
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning"
    )
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


@dataclass
class ReplicaProcess:
    url: str
    process: subprocess.Popen[str]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()

    def terminate(self) -> int:
        """SIGTERM, as the kubelet sends it; returns the exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=120)


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    path = directory / f"{manifest['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


@contextmanager
def replica_process(
    manifest_path: Path, tmp_path: Path, env: dict[str, str] | None = None, timeout_s: float = 180
) -> Iterator[ReplicaProcess]:
    """`batchd serve MANIFEST` as a child process (repo root as cwd); yields once it is ready."""
    port = free_port()
    tmp_path.mkdir(parents=True, exist_ok=True)
    log_path = tmp_path / f"replica-{port}.log"
    # Safe-path mode: the repository root holds a folder named like the stdlib module `operator`.
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1", **(env or {})}
    command = [sys.executable, "-m", "batchd.replica.cli", "serve", str(manifest_path), "--port", str(port)]
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT, text=True
        )
    url = f"http://127.0.0.1:{port}"
    replica = ReplicaProcess(url, process, log_path)
    try:
        wait_until(lambda: process.poll() is not None or is_ready(url), timeout_s, "replica ready")
        if process.poll() is not None:
            raise RuntimeError(f"replica exited with {process.returncode}:\n{replica.log()}")
        yield replica
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
