"""Operator benchmark: how fast a BatchedDeployment gets its Deployment, how fast 500 converge, and
how much memory the operator uses. Not a test: it prints figures.

    python -m batchd.bench.operator_bench [--repeats 20] [--resources 500]

The operator runs as a user runs it (`python -m batchd.operator`, its own process, so its RSS is
its own) against the emulated API server of the tests (`batchd.testing.apiserver`) in this
process. Custom resources still pass the CRD's admission; the children's validation against
the Kubernetes schemas is switched off, so the figures time the operator, not the validator.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from batchd.testing import procstat
from batchd.testing.apiserver import ApiServer
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import api_server, create

NS = "default"


def _rss_mib(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process, in MiB."""
    sample = procstat.sample(pid)
    return sample.rss_bytes / 2**20, sample.peak_rss_bytes / 2**20


async def _until(probe: Any, timeout_s: float, what: str, interval_s: float = 0.002) -> float:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        if probe():
            return time.perf_counter() - started
        await asyncio.sleep(interval_s)
    raise TimeoutError(f"{what} did not happen within {timeout_s}s")


def _converged(server: ApiServer, name: str) -> bool:
    resource = server.get_object("serving.batchd.dev/batcheddeployments", NS, name) or {}
    status = resource.get("status") or {}
    return bool(
        status.get("observed_generation") == resource.get("metadata", {}).get("generation")
        and server.get_object("apps/deployments", NS, name)
        and server.get_object("services", NS, name)
    )


async def run(repeats: int, resources: int, log: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        async with api_server(Path(tmp), validate_children=False) as server:
            env = {
                **os.environ,
                "KUBECONFIG": server.kubeconfig_path,
                "BATCHD_METRICS_PORT": "0",
                "BATCHD_LIVENESS_ENDPOINT": "",
            }
            with log.open("w") as stderr:
                process = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "batchd.operator", env=env, stdout=stderr, stderr=stderr
                )
                try:
                    await _until(
                        lambda: any(
                            call[1] == "batcheddeployments" and call[2] == "watch" for call in server.calls
                        ),
                        60,
                        "the operator watching",
                    )
                    _, idle_peak = _rss_mib(process.pid)

                    latencies = []
                    for index in range(repeats):
                        name = f"latency-{index}"
                        started = time.perf_counter()
                        await create(server, manifest(name))
                        await _until(
                            lambda name=name: server.get_object("apps/deployments", NS, name),
                            30,
                            f"Deployment {name}",
                        )
                        latencies.append(time.perf_counter() - started)

                    cpu_before = procstat.sample(process.pid).cpu_s
                    started = time.perf_counter()
                    names = [f"bulk-{index:04d}" for index in range(resources)]
                    for name in names:
                        await create(server, manifest(name))
                    created_s = time.perf_counter() - started
                    await _until(
                        lambda: all(_converged(server, name) for name in names),
                        600,
                        f"{resources} resources converging",
                        interval_s=0.05,
                    )
                    converge_s = time.perf_counter() - started
                    operator_cpu_s = procstat.sample(process.pid).cpu_s - cpu_before
                    rss, peak = _rss_mib(process.pid)
                finally:
                    process.terminate()  # the API server keeps serving while the operator stops
                    try:
                        await asyncio.wait_for(process.wait(), 30)
                    except TimeoutError:
                        process.kill()
    return {
        "create_to_deployment_median_ms": statistics.median(latencies) * 1000,
        "create_to_deployment_p90_ms": statistics.quantiles(latencies, n=10)[-1] * 1000
        if repeats >= 2
        else 0,
        "bulk_resources": resources,
        "bulk_create_s": created_s,
        "bulk_converge_s": converge_s,
        "bulk_per_second": resources / converge_s,
        "bulk_operator_cpu_s": operator_cpu_s,
        "operator_rss_idle_peak_mib": idle_peak,
        "operator_rss_after_bulk_mib": rss,
        "operator_rss_peak_mib": peak,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="single creates timed one after another")
    parser.add_argument("--resources", type=int, default=500, help="resources created at once to converge")
    parser.add_argument(
        "--log",
        type=Path,
        default=Path(tempfile.gettempdir()) / "batchd-operator-bench.log",
        help="where the operator's own log goes",
    )
    args = parser.parse_args(argv)
    figures = asyncio.run(run(args.repeats, args.resources, args.log))
    print(
        f"create -> Deployment: median {figures['create_to_deployment_median_ms']:.1f} ms, "
        f"p90 {figures['create_to_deployment_p90_ms']:.1f} ms over {args.repeats} creates"
    )
    print(
        f"{args.resources} resources: created in {figures['bulk_create_s']:.1f} s, all converged "
        f"(children + status) after {figures['bulk_converge_s']:.1f} s "
        f"({figures['bulk_per_second']:.1f} resources/s; the operator used "
        f"{figures['bulk_operator_cpu_s']:.1f} s of CPU in that time)"
    )
    print(
        f"operator RSS: {figures['operator_rss_idle_peak_mib']:.0f} MiB idle, "
        f"{figures['operator_rss_after_bulk_mib']:.0f} MiB with {args.resources + args.repeats} resources "
        f"(peak {figures['operator_rss_peak_mib']:.0f} MiB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
