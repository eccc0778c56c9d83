"""Autoscaling at scale: the steady cost to the operator of polling every replica of many
autoscaled resources, window by window."""

from __future__ import annotations

import asyncio
import collections
import itertools
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchd.api.pod import MANAGED_BY
from batchd.bench.kit import procstat
from batchd.bench.kit.stats import mean, median
from batchd.bench.operator_bench.convergence import NS, all_converged, rss_mib
from batchd.bench.operator_bench.load_endpoints import load_server, polls_seen, replica_ip
from batchd.bench.operator_bench.results import Polling, Window
from batchd.operator.settings import Settings
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import api_server, create, operator_process, patch

DEFAULT_POLL_S = float(Settings.model_fields["replica_poll_interval_s"].default)
STATUS_WRITE = ("serving.batchd.dev", "batcheddeployments/status", "patch")


def replica_pod(bd: str, index: int, address: str) -> dict[str, Any]:
    """A replica pod as the operator's Deployment would have it made (what the operator reads of it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{bd}-stand-in-{index}",
            "labels": {
                **MANAGED_BY,
                "app.kubernetes.io/component": "replica",
                "app.kubernetes.io/instance": bd,
            },
        },
        "spec": {
            "containers": [
                {"name": "replica", "image": "stand-in", "ports": [{"name": "http", "containerPort": 8000}]}
            ]
        },
    }


def ready_status(address: str) -> dict[str, Any]:
    return {
        "status": {
            "phase": "Running",
            "podIP": address,
            "podIPs": [{"ip": address}],
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
            ],
        }
    }


async def _in_chunks(calls: Sequence[Any], size: int = 50) -> None:
    for offset in range(0, len(calls), size):
        await asyncio.gather(*(call() for call in calls[offset : offset + size]))


def _cycles(times: Sequence[float], poll_s: float) -> list[tuple[float, float, int]]:
    """The operator's rounds of polls, as (first, last, polls): a pause of a quarter interval
    separates two rounds (a round that took longer than that would merge with the next)."""
    rounds: list[tuple[float, float, int]] = []
    for t in sorted(times):
        if rounds and t - rounds[-1][1] < poll_s / 4:
            first, _, count = rounds[-1]
            rounds[-1] = (first, t, count + 1)
        else:
            rounds.append((t, t, 1))
    return rounds


async def run_autoscaling(
    resources: int, replicas_per: int, steady_s: float, window_s: float, poll_s: float | None, log: Path
) -> Polling:
    """The operator polls `resources` x `replicas_per` stand-in replicas; its CPU and memory in
    windows of `window_s` over `steady_s` once every replica has been polled."""
    interval_s = poll_s or DEFAULT_POLL_S
    total = resources * replicas_per
    env = {"BATCHD_REPLICA_POLL_INTERVAL_S": str(poll_s)} if poll_s else {}
    autoscaling = {"min_replicas": replicas_per, "max_replicas": replicas_per}
    names = [f"auto-{index:04d}" for index in range(resources)]
    with tempfile.TemporaryDirectory() as tmp:
        async with (
            api_server(Path(tmp), validate_children=False) as server,
            load_server(total, log.with_suffix(".loads.log")) as loads,
            operator_process(server, log.with_suffix(".autoscaling.log"), env) as operator,
        ):
            pid = operator.pid
            started = time.perf_counter()
            await _in_chunks(
                [
                    lambda name=name: create(
                        server, manifest(name, num_replicas=replicas_per, autoscaling=autoscaling)
                    )
                    for name in names
                ]
            )
            pods_path = f"/api/v1/namespaces/{NS}/pods"

            async def make_pod(bd: str, index: int, address: str) -> None:
                response = await server.post(pods_path, json=replica_pod(bd, index, address))
                assert response.status == 201, await response.text()
                await patch(server, f"{pods_path}/{bd}-stand-in-{index}/status", ready_status(address))

            await _in_chunks(
                [
                    lambda bd=bd, index=index, at=number * replicas_per + index: make_pod(
                        bd, index, replica_ip(at)
                    )
                    for number, bd in enumerate(names)
                    for index in range(replicas_per)
                ]
            )
            await all_converged(server, names, interval_s=0.1)
            setup_s = time.perf_counter() - started
            # Every replica polled once, and one more quiet interval: the creation burst is over.
            while len({address for _, address in await polls_seen()}) < total:
                if time.perf_counter() - started > 600:
                    raise TimeoutError("the operator did not poll every replica within 600 s")
                await asyncio.sleep(interval_s)
            await asyncio.sleep(interval_s * 2)

            spans: list[tuple[float, float, float, float, int, int]] = []
            calls_before = len(server.calls)
            last = (
                time.time(),
                procstat.sample(pid).cpu_s,
                procstat.sample(loads.pid).cpu_s,
                len(server.calls),
            )
            steady_from = last[0]
            while time.time() < steady_from + steady_s:
                await asyncio.sleep(window_s)
                now = (
                    time.time(),
                    procstat.sample(pid).cpu_s,
                    procstat.sample(loads.pid).cpu_s,
                    len(server.calls),
                )
                calls = server.calls[last[3] : now[3]]
                spans.append(
                    (
                        last[0],
                        now[0],
                        (now[1] - last[1]) / (now[0] - last[0]),
                        (now[2] - last[2]) / (now[0] - last[0]),
                        sum(call == STATUS_WRITE for call in calls),
                        sum(call[2] == "watch" for call in calls),
                    )
                )
                last = now
            rss, peak = rss_mib(pid)
            steady_calls = collections.Counter("/".join(call) for call in server.calls[calls_before:])
            polls = await polls_seen()

    steady_to = spans[-1][1]
    steady = [(t, address) for t, address in polls if steady_from <= t < steady_to]
    windows = []
    for start, end, operator_cores, endpoints_cores, status_writes, watch_restarts in spans:
        inside = [address for t, address in steady if start <= t < end]
        rate = len(inside) / (end - start)
        window = Window(
            start, end, operator_cores, endpoints_cores, status_writes, watch_restarts, rate, len(set(inside))
        )
        windows.append(window)
    per_replica = collections.Counter(address for _, address in steady)
    rounds = _cycles([t for t, _ in steady], interval_s)[1:-1]  # the first and last may be cut off
    duration_s = steady_to - steady_from
    cores = [w.operator_cores for w in windows]
    return Polling(
        resources=resources,
        replicas=total,
        poll_interval_s=interval_s,
        setup_s=setup_s,
        steady_s=duration_s,
        windows=windows,
        operator_cores_median=median(cores),
        operator_cores_max=max(cores),
        operator_cores_mean=mean(cores),
        load_endpoints_cores_median=median([w.load_endpoints_cores for w in windows]),
        operator_rss_mib=rss,
        operator_rss_peak_mib=peak,
        polls_per_s=len(steady) / duration_s,
        expected_polls_per_s=total / interval_s,
        replicas_polled=len(per_replica),
        polls_per_replica_min=min(per_replica.values(), default=0),
        polls_per_replica_max=max(per_replica.values(), default=0),
        expected_polls_per_replica=duration_s / interval_s,
        rounds=len(rounds),
        round_spread_ms_median=median([(last - first) * 1000 for first, last, _ in rounds]),
        round_period_s_median=median([b[0] - a[0] for a, b in itertools.pairwise(rounds)]),
        status_writes=sum(w.status_writes for w in windows),
        status_writes_per_s=sum(w.status_writes for w in windows) / duration_s,
        operator_calls=dict(sorted(steady_calls.items())),
    )
