"""The processes a benchmark measures: `batchd serve` replicas and the bare-uvicorn floor.

Each runs as its own process on a loopback port, optionally pinned to chosen cores, so that its
CPU time and memory can be read from /proc and it competes with the load generator only where
the harness lets it. Every wait is a bounded poll.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from batchd.bench import procstat


class ServerFailed(RuntimeError):
    """A server did not start, or died; the message carries the tail of its log."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, timeout_s: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def metrics(self) -> str:
        status, text = http_get(f"{self.url}/metrics")
        if status != 200:
            raise ServerFailed(f"{self.name}: GET /metrics answered {status}")
        return text

    def sample(self) -> procstat.ProcessSample:
        return procstat.sample(self.pid)

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise ServerFailed(
                f"{self.name} exited with status {self.process.returncode}; its log ends with:\n"
                f"{self.log_tail()}"
            )

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.check_alive()
            try:
                if http_get(f"{self.url}/v2/health/ready", timeout_s=1)[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ServerFailed(
                    f"{self.name}: not ready within {timeout_s:.0f} s; log:\n{self.log_tail()}"
                )
            time.sleep(0.1)

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM (the replica drains and exits 0), then SIGKILL if it will not go."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        return int(self.process.returncode)


def _pinned(cores: set[int] | None) -> Any:
    if not cores:
        return None
    return lambda: os.sched_setaffinity(0, cores)


def start(
    name: str,
    command: list[str],
    log_dir: Path,
    env: dict[str, str] | None = None,
    cores: set[int] | None = None,
    port: int | None = None,
) -> Server:
    port = port or free_port()
    log_path = log_dir / f"{name}-{port}.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*command, "--port", str(port)],
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_pinned(cores),
        )
    return Server(name, port, process, log_path)


def start_replica(
    name: str,
    manifest_path: Path,
    log_dir: Path,
    env: dict[str, str] | None = None,
    cores: set[int] | None = None,
) -> Server:
    """`batchd serve MANIFEST` (the console script beside this interpreter, else the module)."""
    script = Path(sys.executable).with_name("batchd")
    base = [str(script)] if script.exists() else [sys.executable, "-m", "batchd.replica.cli"]
    return start(name, [*base, "serve", str(manifest_path), "--host", "127.0.0.1"], log_dir, env, cores)


def start_floor(log_dir: Path, cores: set[int] | None = None) -> Server:
    return start("floor", [sys.executable, "-m", "batchd.bench.floor"], log_dir, cores=cores)


def write_manifest(path: Path, manifest: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return path


@contextmanager
def running(servers: list[Server], ready_timeout_s: float = 300) -> Iterator[list[Server]]:
    """Wait until every server is ready; stop them all on the way out, whatever happens."""
    try:
        for server in servers:
            server.wait_ready(ready_timeout_s)
        yield servers
    finally:
        for server in servers:
            server.stop()
