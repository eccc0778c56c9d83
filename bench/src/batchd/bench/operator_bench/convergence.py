"""Convergence: how fast one resource gets its Deployment, how fast many converge, and the
operator's memory meanwhile."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from batchd.api.spec import GROUP, PLURAL, VERSION
from batchd.bench.kit import procstat
from batchd.bench.kit.stats import median, percentile
from batchd.bench.operator_bench.results import Convergence
from batchd.testing.kubernetes.release import Release, list_objects
from batchd.testing.manifests import manifest


def rss_mib(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process, in MiB."""
    sample = procstat.sample(pid)
    return sample.rss_bytes / 2**20, sample.peak_rss_bytes / 2**20


async def until(probe: Any, timeout_s: float, what: str, interval_s: float = 0.005) -> float:
    """Seconds until `probe()` (a blocking read of the API server, run in a thread) is true."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        if await asyncio.to_thread(probe):
            return time.perf_counter() - started
        await asyncio.sleep(interval_s)
    raise TimeoutError(f"{what} did not happen within {timeout_s}s")


def create(release: Release, document: dict[str, Any]) -> None:
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{release.namespace}/{PLURAL}"
    release.api.post(path, json=document).raise_for_status()


def converged_names(release: Release) -> set[str]:
    """The resources that have a Deployment and a Service, and a status for their generation: three
    LISTs, however many resources."""
    deployments = {
        item["metadata"]["name"] for item in list_objects(release.api, "deployment", release.namespace)
    }
    services = {item["metadata"]["name"] for item in list_objects(release.api, "service", release.namespace)}
    return {
        item["metadata"]["name"]
        for item in list_objects(release.api, "bd", release.namespace)
        if (item.get("status") or {}).get("observed_generation") == item["metadata"].get("generation")
        and item["metadata"]["name"] in deployments
        and item["metadata"]["name"] in services
    }


async def all_converged(release: Release, names: list[str], interval_s: float) -> float:
    """Seconds until every named resource has its children and a status for its generation."""
    wanted = set(names)
    return await until(
        lambda: wanted <= converged_names(release), 600, f"{len(names)} resources converging", interval_s
    )


async def measure_convergence(release: Release, repeats: int, resources: int, log: Path) -> Convergence:
    # No replicas: a pod nothing can schedule (the cluster has no node) would only add the
    # scheduler's retries to what is measured; the operator's work is the same for any count.
    with release.operator(log) as operator:
        pid = operator.pid
        _, idle_peak = rss_mib(pid)

        latencies = []
        for index in range(repeats):
            name = f"latency-{index}"
            started = time.perf_counter()
            await asyncio.to_thread(create, release, manifest(name, num_replicas=0))
            await until(
                lambda name=name: release.get("deployment", name),
                30,
                f"Deployment {name}",
            )
            latencies.append(time.perf_counter() - started)

        cpu_before = procstat.sample(pid).cpu_s
        started = time.perf_counter()
        names = [f"bulk-{index:04d}" for index in range(resources)]
        for name in names:
            await asyncio.to_thread(create, release, manifest(name, num_replicas=0))
        created_s = time.perf_counter() - started
        await all_converged(release, names, interval_s=0.05)
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
