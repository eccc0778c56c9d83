"""What the router adds over going direct, on a trivial adder: latency (p50) and CPU per request.

One trivial adder process, one router process in front of it (endpoints from the emulated API
server), one client (this process, a small httptools client so that the client costs little).
Rounds alternate direct and through the router; each reports the median of its rounds:
- p50 and p99 latency with one request in flight (the added p50 is what a request pays);
- with `--in-flight` requests in flight: requests/s, and the router's CPU per request, read from
  /proc, from which requests/s per router core follows.

    .venv/bin/python router/benchmarks/overhead.py [--requests 3000] [--rounds 5] [--in-flight 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import uvloop
import yaml
from upstream_clients import HERE, ProtocolPool, listening

from batchd.testing.apiserver import ApiServer, Resource, default_resources, kubeconfig_for
from batchd.testing.manifests import manifest
from batchd.testing.servers import ServerProcess, start_process

SLICES = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
DEPLOYMENTS = "/apis/serving.batchd.dev/v1alpha1/namespaces/default/batcheddeployments"


async def _wait(probe: Any, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not await probe():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.05)


async def _latencies(pool: ProtocolPool, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        assert await pool.post() == 200
        times.append(time.perf_counter() - started)
    return times


async def _throughput(
    pool: ProtocolPool, count: int, in_flight: int, router: ServerProcess
) -> tuple[float, float]:
    """(requests/s, router CPU microseconds per request) over `count` requests."""
    pending = iter(range(count))

    async def worker() -> None:
        for _ in pending:
            assert await pool.post() == 200

    cpu = router.sample().cpu_s
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = time.perf_counter() - started
    return count / elapsed, (router.sample().cpu_s - cpu) / count * 1e6


@contextlib.asynccontextmanager
async def routed(
    logs: Path, deployment: str, replicas: list[ServerProcess]
) -> AsyncIterator[tuple[ApiServer, ServerProcess]]:
    """The emulated API server holding `deployment` and an EndpointSlice per replica, and a router
    process on it, yielded once ready; the API server lets a benchmark add replicas later."""
    async with ApiServer() as api, kmock.Server(api):
        api.register([*default_resources(), Resource("discovery.k8s.io", "endpointslices", "EndpointSlice")])
        kubeconfig = logs / "kubeconfig.yaml"
        kubeconfig.write_text(yaml.safe_dump(kubeconfig_for(str(api.url).rstrip("/"))))
        await api.post(DEPLOYMENTS, json=manifest(deployment))
        for replica in replicas:
            await api.post(SLICES, json=endpoint_slice(deployment, replica))
        env = {"KUBECONFIG": str(kubeconfig), "BATCHD_LOG_LEVEL": "warning"}
        router = start_process("router", [sys.executable, "-m", "batchd.router"], logs, env=env)
        try:
            await _wait(lambda: _ready(router), "the router ready")
            yield api, router
        finally:
            router.stop()


async def measure(args: argparse.Namespace, logs: Path) -> dict[str, list[float]]:
    adder = start_process("trivial-adder", _uvicorn("trivial_adder:app"), logs)
    try:
        await _wait(lambda: _async(listening(adder)), "the trivial adder listening")
        async with routed(logs, "adder", [adder]) as (_, router):
            return await _rounds(args, adder, router)
    finally:
        adder.stop()


async def _rounds(
    args: argparse.Namespace, adder: ServerProcess, router: ServerProcess
) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    pools = {"direct": ProtocolPool(adder.host, adder.port), "router": ProtocolPool(router.host, router.port)}
    for pool in pools.values():
        await _latencies(pool, 200)  # warm: connections, the router's pool to the adder
    for _ in range(args.rounds):
        for name, pool in pools.items():
            times = sorted(await _latencies(pool, args.requests))
            results.setdefault(f"{name} p50 ms", []).append(times[len(times) // 2] * 1e3)
            results.setdefault(f"{name} p99 ms", []).append(times[int(len(times) * 0.99)] * 1e3)
            rate, cpu_us = await _throughput(pool, args.requests, args.in_flight, router)
            results.setdefault(f"{name} requests/s at {args.in_flight} in flight", []).append(rate)
            if name == "router":
                results.setdefault("router CPU us per request", []).append(cpu_us)
    return results


def endpoint_slice(service: str, replica: ServerProcess) -> dict[str, Any]:
    """One replica's EndpointSlice of `service` (a slice has one port; each replica has its own)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": f"{service}-{replica.port}", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": replica.port}],
        "endpoints": [{"addresses": [replica.host], "conditions": {"ready": True}}],
    }


def _uvicorn(app: str) -> list[str]:
    return [sys.executable, "-m", "uvicorn", app, "--app-dir", str(HERE), "--loop", "uvloop", "--http",
            "httptools", "--no-access-log", "--log-level", "warning"]  # fmt: skip


async def _async(value: bool) -> bool:
    return value


async def _ready(router: ServerProcess) -> bool:
    router.check_alive()
    try:
        async with aiohttp.ClientSession() as client, client.get(f"{router.url}/readyz") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--in-flight", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as logs:
        results = uvloop.run(measure(args, Path(logs)))
    print(f"median of {args.rounds} interleaved rounds of {args.requests} requests:")
    for key, values in results.items():
        print(f"  {key:40} {statistics.median(values):9.3f}   ({', '.join(f'{v:.3g}' for v in values)})")
    direct, routed = (statistics.median(results[f"{n} p50 ms"]) for n in ("direct", "router"))
    print(f"  added p50: {routed - direct:.3f} ms; router p50 / direct p50: {routed / direct:.2f}")
    rates = [
        statistics.median(results[f"{n} requests/s at {args.in_flight} in flight"])
        for n in ("direct", "router")
    ]
    print(f"  router / direct requests/s: {rates[1] / rates[0]:.2f}")
    cpu_us = statistics.median(results["router CPU us per request"])
    print(f"  router requests/s per core (1 / CPU per request): {1e6 / cpu_us:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
