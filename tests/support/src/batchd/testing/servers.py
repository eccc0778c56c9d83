"""Real servers on loopback, for tests, benchmarks and the demo: `batchd serve`, `batchd-router` (or
any server taking --host and --port) in a process of its own, and uvicorn in a thread for an app
built in a test itself (`uvicorn_in_thread`).

A server process gets its own loopback address and port, optionally its own cores, and its own
log file, so that its CPU time and memory can be read from /proc and a failure shows its log.
Every wait is a bounded poll; nothing sleeps to synchronise.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml

from batchd.testing import ROOT
from batchd.testing.waiting import answers_ok


class ServerFailed(RuntimeError):
    """A server did not start, or died; the message carries the tail of its log."""


# Ports are picked below the kernel's ephemeral range (net.ipv4.ip_local_port_range), from which
# every outgoing connection takes its local port: a port picked there could be taken by a connection
# between the pick and the server's bind.
EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to on `host` now, outside the ephemeral range."""
    first_ephemeral = int(EPHEMERAL_PORTS.read_text().split()[0]) if EPHEMERAL_PORTS.exists() else 32768
    for port in random.sample(range(LOWEST_PORT, first_ephemeral), 200):
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} between {LOWEST_PORT} and {first_ephemeral}")


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.02) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not true within {timeout_s} s")
        time.sleep(interval_s)


# Where each kind of server says it is ready: a replica's Open Inference Protocol health route,
# the router's /readyz (its first LIST of deployments and endpoints done).
REPLICA_READY_PATH = "/v2/health/ready"
ROUTER_READY_PATH = "/readyz"
READY_TIMEOUT_S = 300.0  # how long `running` waits for a server to be ready


def is_ready(url: str, path: str = REPLICA_READY_PATH) -> bool:
    return answers_ok(f"{url}{path}")


def write_manifest(directory: Path, manifest: dict[str, Any]) -> Path:
    """`<directory>/<name>.yaml`: the manifest as `batchd serve` and `kubectl apply` read it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{manifest['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return path


@dataclass
class ServerProcess:
    """A server in a process of its own, as the kubelet would run it."""

    name: str
    host: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    ready_path: str = REPLICA_READY_PATH
    admin_port: int = 0  # a router's admin port (`/metrics`, `GET /held`); 0: none

    @property
    def admin_url(self) -> str:
        assert self.admin_port, f"{self.name} has no admin port"
        return f"http://{self.host}:{self.admin_port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise ServerFailed(
                f"{self.name} exited with status {self.process.returncode}; its log ends with:\n"
                f"{self.log_tail()}"
            )

    def wait_ready(self, timeout_s: float) -> None:
        def ready() -> bool:
            self.check_alive()
            return is_ready(self.url, self.ready_path)

        try:
            wait_until(ready, timeout_s, f"{self.name} ready", interval_s=0.05)
        except TimeoutError:
            raise ServerFailed(
                f"{self.name}: not ready within {timeout_s:.0f} s; log:\n{self.log_tail()}"
            ) from None

    def metrics(self) -> str:
        """Its /metrics page (a router's on its admin port)."""
        response = httpx.get(f"{self.admin_url if self.admin_port else self.url}/metrics", timeout=5)
        if response.status_code != 200:
            raise ServerFailed(f"{self.name}: GET /metrics answered {response.status_code}")
        return response.text

    def load(self) -> dict[str, Any]:
        """A replica's `GET /load`: what it holds now (queued and running items, requests)."""
        answer: dict[str, Any] = httpx.get(f"{self.url}/load", timeout=5).json()
        return answer

    def idle(self) -> bool:
        """A replica with nothing queued and nothing in its model."""
        now = self.load()
        return bool(now["queued_items"] == 0 and now["running_items"] == 0)

    def terminate(self, timeout_s: float = 120) -> int:
        """SIGTERM, as the kubelet sends it; the exit status once the process has drained."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout_s)

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM, then SIGKILL if it will not go; the exit status either way."""
        if self.process.poll() is None:
            try:
                return self.terminate(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        return int(self.process.returncode)


def start_process(
    name: str,
    command: Sequence[str],
    log_dir: Path,
    *,
    env: dict[str, str] | None = None,
    cores: set[int] | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    ready_path: str = REPLICA_READY_PATH,
) -> ServerProcess:
    """Start `command --host H --port P` with the repository root as its working directory."""
    port = port or free_port(host)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{host}-{port}.log"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*command, "--host", host, "--port", str(port)],
            cwd=ROOT,  # handlers such as examples.adder import from here, as from /app in the image
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=pin,
        )
    return ServerProcess(name, host, port, process, log_path, ready_path)


def batchd_command() -> list[str]:
    """`batchd`, the console script installed beside this interpreter."""
    return [str(Path(sys.executable).with_name("batchd"))]


def start_replica(
    manifest_path: Path,
    log_dir: Path,
    *,
    name: str | None = None,
    env: dict[str, str] | None = None,
    cores: set[int] | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
) -> ServerProcess:
    """`batchd serve MANIFEST` in its own process; not waited on (see `replica_process`)."""
    return start_process(
        name or manifest_path.stem,
        [*batchd_command(), "serve", str(manifest_path)],
        log_dir,
        env=env,
        cores=cores,
        host=host,
        port=port,
    )


def router_command() -> list[str]:
    """`batchd-router`, the console script installed beside this interpreter."""
    return [str(Path(sys.executable).with_name("batchd-router"))]


def start_router(
    kubeconfig: Path | str,
    log_dir: Path,
    *,
    name: str = "router",
    settings: dict[str, Any] | None = None,
    cores: set[int] | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """`batchd-router` in its own process, reading the cluster through `kubeconfig`; `settings` are
    RouterSettings fields (`{"hold_timeout_s": 5}` -> `BATCHD_HOLD_TIMEOUT_S=5`), `env` other
    variables (OTEL_*). Not waited on: `wait_ready` returns once it has listed the deployments and
    endpoints. Its admin port is a free one unless `settings` name it, so that routers of one
    machine never meet on the default (`admin_url`)."""
    settings = {"admin_port": free_port(host), **(settings or {})}
    env = {**(env or {}), "KUBECONFIG": str(kubeconfig), "BATCHD_LOG_LEVEL": "warning"}
    env.update({f"BATCHD_{key.upper()}": str(value) for key, value in settings.items()})
    router = start_process(
        name,
        router_command(),
        log_dir,
        env=env,
        cores=cores,
        host=host,
        port=port,
        ready_path=ROUTER_READY_PATH,
    )
    router.admin_port = int(settings["admin_port"])
    return router


@contextmanager
def running(
    servers: Sequence[ServerProcess],
    ready_timeout_s: float = READY_TIMEOUT_S,
    *,
    waited: Sequence[ServerProcess] | None = None,
) -> Iterator[Sequence[ServerProcess]]:
    """Wait until every server of `waited` (all of them by default) is ready; stop them all on the
    way out, whatever happens."""
    try:
        for server in servers if waited is None else waited:
            server.wait_ready(ready_timeout_s)
        yield servers
    finally:
        for server in servers:
            server.stop()


@contextmanager
def replica_process(
    manifest_path: Path,
    log_dir: Path,
    env: dict[str, str] | None = None,
    timeout_s: float = 180,
    host: str = "127.0.0.1",
) -> Iterator[ServerProcess]:
    """`batchd serve MANIFEST` listening on `host`, yielded once ready; killed on the way out if
    still running."""
    replica = start_replica(manifest_path, log_dir, env=env, host=host)
    try:
        replica.wait_ready(timeout_s)
        yield replica
    finally:
        if replica.process.poll() is None:
            replica.process.kill()
            replica.process.wait(timeout=30)


@contextmanager
def uvicorn_in_thread(
    app: Any,
    timeout_s: float = 120,
    wait_ready: bool = True,
    http: Any = "httptools",
    host: str = "127.0.0.1",
) -> Iterator[str]:
    """Serve an ASGI app with a real uvicorn on a port of `host` (loopback unless told); yields its
    base URL once it listens and, with `wait_ready`, once its model is ready. `http`: uvicorn's
    protocol (a name or a class, as the replica's `batchd.replica.front.server.replica_protocol`)."""
    port = free_port(host)
    config = uvicorn.Config(app, host=host, port=port, loop="uvloop", http=http, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    url = f"http://{host}:{port}"
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
