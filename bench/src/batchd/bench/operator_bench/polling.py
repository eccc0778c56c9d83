"""Autoscaling at scale: the steady cost to the operator of polling every replica of many
autoscaled resources, window by window."""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchd.api.spec import GROUP, PLURAL
from batchd.bench.kit import procstat
from batchd.bench.kit.stats import mean, median
from batchd.bench.operator_bench.convergence import all_converged, create, rss_mib
from batchd.bench.operator_bench.load_endpoints import load_server, polls_seen, replica_ip
from batchd.bench.operator_bench.results import Polling, Window
from batchd.operator.settings import Settings
from batchd.testing.kubernetes.components import call
from batchd.testing.kubernetes.release import Release
from batchd.testing.manifests import manifest

DEFAULT_POLL_S = float(Settings.model_fields["replica_poll_interval_s"].default)
STATUS_WRITE = (GROUP, f"{PLURAL}/status", "patch")


def ready_status(address: str) -> dict[str, Any]:
    """What a kubelet reports of a replica pod once it is Ready at `address`."""
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


def report_ready(release: Release, names: Sequence[str], replicas_per: int) -> None:
    """Wait (bounded) for every replica pod the Deployments ask for, then report each Ready at an
    address of its own, as its kubelet would once it ran."""
    deadline = time.monotonic() + 600
    path = f"/api/v1/namespaces/{release.namespace}/pods/{{}}/status"
    for number, name in enumerate(names):
        while len(pods := release.pods(name)) < replicas_per:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: {len(pods)} of {replicas_per} replica pods made within 600 s")
            time.sleep(0.2)
        for index, pod in enumerate(sorted(pod["metadata"]["name"] for pod in pods)):
            status = ready_status(replica_ip(number * replicas_per + index))
            response = release.api.patch(
                path.format(pod), json=status, headers={"Content-Type": "application/merge-patch+json"}
            )
            response.raise_for_status()


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


def _operator_calls(release: Release, since: int) -> list[tuple[str, str, str]]:
    """Each request of the operator's from its `since`-th on, as the API server's audit log has it."""
    return [call(event) for event in release.cluster.audit_events(release.operator_user)[since:]]


async def run_autoscaling(
    release: Release,
    resources: int,
    replicas_per: int,
    steady_s: float,
    window_s: float,
    poll_s: float | None,
    log: Path,
) -> Polling:
    """The operator polls `resources` x `replicas_per` stand-in replicas; its CPU and memory in
    windows of `window_s` over `steady_s` once every replica has been polled."""
    interval_s = poll_s or DEFAULT_POLL_S
    total = resources * replicas_per
    env = {"BATCHD_REPLICA_POLL_INTERVAL_S": str(poll_s)} if poll_s else {}
    autoscaling = {"min_replicas": replicas_per, "max_replicas": replicas_per}
    names = [f"auto-{index:04d}" for index in range(resources)]
    async with load_server(total, log.with_suffix(".loads.log")) as loads:
        with release.operator(log.with_suffix(".autoscaling.log"), env) as operator:
            pid = operator.pid
            started = time.perf_counter()
            for name in names:
                document = manifest(name, num_replicas=replicas_per, autoscaling=autoscaling)
                await asyncio.to_thread(create, release, document)
            await asyncio.to_thread(report_ready, release, names, replicas_per)
            await all_converged(release, names, interval_s=0.1)
            setup_s = time.perf_counter() - started
            # Every replica polled once, and one more quiet interval: the creation burst is over.
            while len({address for _, address in await polls_seen()}) < total:
                if time.perf_counter() - started > 600:
                    raise TimeoutError("the operator did not poll every replica within 600 s")
                await asyncio.sleep(interval_s)
            await asyncio.sleep(interval_s * 2)

            spans: list[tuple[float, float, float, float, int, int]] = []
            calls_before = len(await asyncio.to_thread(_operator_calls, release, 0))
            last = (time.time(), procstat.sample(pid).cpu_s, procstat.sample(loads.pid).cpu_s, calls_before)
            steady_from = last[0]
            while time.time() < steady_from + steady_s:
                await asyncio.sleep(window_s)
                calls = await asyncio.to_thread(_operator_calls, release, last[3])
                now = (
                    time.time(),
                    procstat.sample(pid).cpu_s,
                    procstat.sample(loads.pid).cpu_s,
                    last[3] + len(calls),
                )
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
            since_steady = await asyncio.to_thread(_operator_calls, release, calls_before)
            steady_calls = collections.Counter("/".join(call) for call in since_steady)
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
