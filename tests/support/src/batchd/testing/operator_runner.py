"""Run the real Kopf operator against the emulated API server, in its own thread, as a user would.

Kopf gets its own thread and event loop (running it inside pytest's loop breaks teardown: on stop
Kopf cancels tasks created after it started). The API server lives in the test's loop; tests
poll it with a bound (`eventually`) instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, overload

import kmock
import kopf
import yaml

from batchd.operator import kopf_handlers  # noqa: F401  (registers the handlers)
from batchd.operator.settings import Settings
from batchd.testing.apiserver import ApiServer, default_resources, kubeconfig_for

T = TypeVar("T")
CR_PATH = "/apis/serving.batchd.dev/v1alpha1/namespaces/{ns}/batcheddeployments"


@overload
async def eventually(probe: Callable[[], Awaitable[T]], *, timeout_s: float = ..., what: str = ...) -> T: ...
@overload
async def eventually(probe: Callable[[], T], *, timeout_s: float = ..., what: str = ...) -> T: ...
async def eventually(
    probe: Callable[[], T | Awaitable[T]], *, timeout_s: float = 15.0, what: str = "the condition"
) -> T:
    """Poll `probe` (plain or async) until it returns something truthy, in the test's loop so that
    the emulator keeps serving meanwhile; fail after `timeout_s` saying what was awaited."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        result = probe()
        last = await result if inspect.isawaitable(result) else result
        if last:
            return last  # type: ignore[no-any-return]
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last seen: {last!r}")


async def settled(server: ApiServer, *, quiet_s: float = 0.5, timeout_s: float = 15.0) -> None:
    """Wait (bounded) until the operator has made no API call for `quiet_s`: nothing left in flight,
    so what happens next is caused by what the test does next."""
    deadline = time.monotonic() + timeout_s
    seen, since = len(server.calls), time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        if len(server.calls) != seen:
            seen, since = len(server.calls), time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
    raise AssertionError(f"the operator kept calling the API for {timeout_s}s")


@contextlib.asynccontextmanager
async def api_server(tmp_path: Path, *, validate_children: bool = True) -> AsyncIterator[ApiServer]:
    async with ApiServer() as server, kmock.Server(server):
        server.register(default_resources(validate_children=validate_children))
        kubeconfig = tmp_path / "kubeconfig.yaml"
        kubeconfig.write_text(yaml.safe_dump(kubeconfig_for(str(server.url).rstrip("/"))))
        server.kubeconfig_path = str(kubeconfig)
        yield server


@contextlib.asynccontextmanager
async def running_operator(
    server: ApiServer, *, liveness_endpoint: str | None = None, metrics_port: int = 0, **settings_: Any
) -> AsyncIterator[threading.Thread]:
    """Start the operator (with `Settings` fields in `settings_`, e.g. replica_poll_interval_s);
    yield once it watches BatchedDeployments; stop it and wait on exit."""
    stop_flag, ready_flag = threading.Event(), threading.Event()
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    settings.networking.error_backoffs = [0.1, 0.2, 0.5]
    settings.watching.reconnect_backoff = 0.1
    memo = kopf.Memo(
        settings=Settings(
            kubeconfig=server.kubeconfig_path,
            metrics_port=metrics_port,
            liveness_endpoint=liveness_endpoint or "",
            **settings_,
        )
    )
    previous = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = server.kubeconfig_path  # read by the login handler, in the operator's thread
    watched_before = _watches(server)
    thread = threading.Thread(
        target=kopf.run,
        kwargs=dict(
            standalone=True,
            clusterwide=True,
            settings=settings,
            memo=memo,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
            liveness_endpoint=liveness_endpoint,
        ),
        name="kopf-operator",
        daemon=True,
    )
    thread.start()
    try:
        await eventually(ready_flag.is_set, what="the operator to start")
        await eventually(lambda: _watches(server) > watched_before, what="the operator to watch the CRs")
        yield thread
    finally:
        stop_flag.set()
        await asyncio.to_thread(thread.join, 20)
        if previous is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = previous
        assert not thread.is_alive(), "the operator did not stop"


@contextlib.asynccontextmanager
async def operator_process(
    server: ApiServer, log_path: Path, env: dict[str, str] | None = None
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`python -m batchd.operator` as a user runs it, in a process of its own (so that it can be
    killed, and its CPU and memory are its own), yielded once it watches the resources. On the
    way out it is stopped (SIGTERM, then SIGKILL) if it is still running; the API server keeps
    serving meanwhile."""
    full_env = {
        **os.environ,
        "KUBECONFIG": server.kubeconfig_path,
        "BATCHD_METRICS_PORT": "0",
        "BATCHD_LIVENESS_ENDPOINT": "",
        **(env or {}),
    }
    watched_before = _watches(server)
    with log_path.open("a") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "batchd.operator", env=full_env, stdout=log, stderr=log
        )
    try:
        await eventually(
            lambda: process.returncode is not None or _watches(server) > watched_before,
            timeout_s=60,
            what="the operator process to watch the resources",
        )
        if process.returncode is not None:
            output = await asyncio.to_thread(log_path.read_text)
            raise RuntimeError(f"the operator exited with {process.returncode}:\n{output}")
        yield process
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                process.kill()
                await process.wait()


def _watches(server: ApiServer) -> int:
    return sum(1 for call in server.calls if call == ("serving.batchd.dev", "batcheddeployments", "watch"))


async def call(
    server: ApiServer, method: str, path: str, body: Any = None, content_type: str = "application/json"
) -> Any:
    """One request as the test's own client; the answer's document, which must be a success."""
    response = await server.request(
        method,
        path,
        data=json.dumps(body) if body is not None else None,
        headers={"Content-Type": content_type},
    )
    document = await response.json()
    assert 200 <= response.status < 300, document
    return document


async def create(server: ApiServer, document: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    response = await server.post(CR_PATH.format(ns=namespace), json=document)
    body: dict[str, Any] = await response.json()
    assert response.status == 201, body
    return body


async def patch(
    server: ApiServer, path: str, body: Any, content_type: str = "application/merge-patch+json"
) -> dict[str, Any]:
    response = await server.patch(path, data=json.dumps(body), headers={"Content-Type": content_type})
    result: dict[str, Any] = await response.json()
    assert response.status == 200, result
    return result
