"""Convergence: how fast one resource gets its Deployment, how fast many converge, and the
operator's memory meanwhile."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from batchd.bench.kit import procstat
from batchd.bench.kit.stats import median, percentile
from batchd.bench.operator_bench.results import Convergence
from batchd.testing.apiserver import ApiServer
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import api_server, create, operator_process

NS = "default"


def rss_mib(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process, in MiB."""
    sample = procstat.sample(pid)
    return sample.rss_bytes / 2**20, sample.peak_rss_bytes / 2**20


async def until(probe: Any, timeout_s: float, what: str, interval_s: float = 0.002) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        if probe():
            return time.perf_counter() - started
        await asyncio.sleep(interval_s)
    raise TimeoutError(f"{what} did not happen within {timeout_s}s")


def converged(server: ApiServer, name: str) -> bool:
    resource = server.get_object("serving.batchd.dev/batcheddeployments", NS, name) or {}
    status = resource.get("status") or {}
    return bool(
        status.get("observed_generation") == resource.get("metadata", {}).get("generation")
        and server.get_object("apps/deployments", NS, name)
        and server.get_object("services", NS, name)
    )


async def all_converged(server: ApiServer, names: list[str], interval_s: float) -> float:
    """Seconds until every named resource has its children and a status for its generation."""
    return await until(
        lambda: all(converged(server, name) for name in names),
        600,
        f"{len(names)} resources converging",
        interval_s=interval_s,
    )


async def measure_convergence(repeats: int, resources: int, log: Path) -> Convergence:
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            api_server(Path(tmp), validate_children=False) as server,
            operator_process(server, log) as operator,
        ):
            pid = operator.pid
            _, idle_peak = rss_mib(pid)

            latencies = []
            for index in range(repeats):
                name = f"latency-{index}"
                started = time.perf_counter()
                await create(server, manifest(name))
                await until(
                    lambda name=name: server.get_object("apps/deployments", NS, name),
                    30,
                    f"Deployment {name}",
                )
                latencies.append(time.perf_counter() - started)

            cpu_before = procstat.sample(pid).cpu_s
            started = time.perf_counter()
            names = [f"bulk-{index:04d}" for index in range(resources)]
            for name in names:
                await create(server, manifest(name))
            created_s = time.perf_counter() - started
            await all_converged(server, names, interval_s=0.05)
            converge_s = time.perf_counter() - started
            operator_cpu_s = procstat.sample(pid).cpu_s - cpu_before
            rss, peak = rss_mib(pid)
    return Convergence(
        repeats=repeats,
        create_to_deployment_median_ms=median(latencies) * 1000,
        create_to_deployment_p90_ms=percentile(latencies, 90) * 1000,
        bulk_resources=resources,
        bulk_create_s=created_s,
        bulk_converge_s=converge_s,
        bulk_per_second=resources / converge_s,
        bulk_operator_cpu_s=operator_cpu_s,
        operator_rss_idle_peak_mib=idle_peak,
        operator_rss_after_bulk_mib=rss,
        operator_rss_peak_mib=peak,
    )
