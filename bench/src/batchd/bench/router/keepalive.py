"""The keep-alive step: a slow adder scaled from 1 to 4 replicas under a keep-alive client, once
through a connection-balancing proxy (what a Service does) and once through the router; then
steady runs at one utilisation through each path, beside one replica alone at the same
per-replica utilisation (the p99 baseline). Paths take turns within each repeat."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from batchd.bench.kit.loadgen import Poller
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import interleaved
from batchd.bench.router.analysis import (
    KeepaliveResult,
    SteadyRun,
    StepRun,
    latency_ms,
    lost,
    overall_shares,
    settle_s,
    statuses,
    window_shares,
)
from batchd.bench.router.balancer import ConnectionBalancer
from batchd.bench.router.options import (
    BATCH_S,
    MAX_BATCH,
    REPLICA_CAPACITY_RPS,
    SLOW_MODEL,
    SLOW_PATH,
    KeepaliveOptions,
)
from batchd.bench.router.standin import routed
from batchd.testing import servers
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.manifests import manifest
from batchd.testing.promtext import parse_counter
from batchd.testing.servers import ServerProcess
from batchd.testing.traffic import Outcome, Traffic

BODY = b'{"instances": [1]}'


async def _at(when: float, action: Callable[[], Awaitable[None]]) -> None:
    """`action` at `when` (time.perf_counter())."""
    await asyncio.sleep(max(0.0, when - time.perf_counter()))
    await action()


SUBJECTS = ("step: service", "step: router", "steady: one replica", "steady: service", "steady: router")


def slow_manifest() -> dict[str, object]:
    model = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": BATCH_S}}
    # A queue deep enough that what the client sees is where requests went, not refusals.
    batching = {"max_batch_size": MAX_BATCH, "batch_wait_timeout_s": 0.005, "max_queued_requests": 4096}
    return manifest(SLOW_MODEL, model, batching=batching)


def answered_counts(bodies: Sequence[bytes]) -> list[float]:
    """Requests each replica answered 200 so far, from its /metrics."""
    return [parse_counter(body.decode(), "batchd_requests", {"outcome": "success"}) for body in bodies]


async def _with_counts(
    replicas: Sequence[ServerProcess],
    options: KeepaliveOptions,
    load: Callable[[float], Awaitable[list[Outcome]]],
) -> tuple[list[Outcome], list[tuple[float, list[float]]]]:
    """Run `load(start)` while every replica's answer count is read every `sample_s`."""
    start = time.perf_counter()
    pollers = [Poller(r.host, r.port, "/metrics", options.sample_s, start=start) for r in replicas]
    for poller in pollers:
        await poller.__aenter__()
    try:
        outcomes = await load(start)
    finally:
        for poller in pollers:
            await poller.__aexit__(None, None, None)
    length = min(len(poller.samples) for poller in pollers)
    samples = [
        (pollers[0].samples[i][0], answered_counts([poller.samples[i][1] for poller in pollers]))
        for i in range(length)
    ]
    return outcomes, samples


async def step_run(
    path: str,
    replicas: Sequence[ServerProcess],
    options: KeepaliveOptions,
    cluster: ControlPlane,
    workdir: Path,
    repeat: int,
) -> StepRun:
    """One replica an endpoint when the load starts, all of them `scale_at_s` later."""
    first, added = replicas[0], replicas[1:]

    def load(
        url: str, scale_up: Callable[[], Awaitable[None]]
    ) -> Callable[[float], Awaitable[list[Outcome]]]:
        """The client's keep-alive pool at the rate, the other replicas added `scale_at_s` in."""

        async def run(start: float) -> list[Outcome]:
            traffic = Traffic(
                lambda: [url], "", BODY, options.rate_rps, options.timeout_s, options.connections
            )
            scaling = asyncio.ensure_future(_at(start + options.scale_at_s, scale_up))
            try:
                return await traffic.run(options.step_s, start)
            finally:
                await scaling

        return run

    if path == "service":
        async with ConnectionBalancer([(first.host, first.port)]) as balancer:

            async def scale_up() -> None:
                balancer.endpoints = [(r.host, r.port) for r in replicas]

            outcomes, samples = await _with_counts(
                replicas, options, load(f"{balancer.url}{SLOW_PATH}", scale_up)
            )
    else:
        async with routed(cluster, workdir, SLOW_MODEL, [first]) as stand_in:

            async def scale_up() -> None:
                for replica in added:
                    await stand_in.publish(replica)

            url = f"{stand_in.router.url}{SLOW_PATH}"
            outcomes, samples = await _with_counts(replicas, options, load(url, scale_up))
    times, shares = window_shares(samples, options.window_s)
    series = {"t": [round(t, 3) for t in times], **{f"r{i}": share for i, share in enumerate(shares)}}
    return StepRun(
        path=path,
        repeat=repeat,
        requests=len(outcomes),
        statuses=statuses(outcomes),
        unanswered=lost(outcomes),
        p99_ms=latency_ms(outcomes, 99),
        shares=overall_shares(samples[0][1], samples[-1][1]) if samples else [],
        settle_s=[
            settle_s(times, shares[i], options.scale_at_s, len(replicas)) for i in range(1, len(replicas))
        ],
        series=series,
    )


async def steady_run(
    subject: str,
    replicas: Sequence[ServerProcess],
    options: KeepaliveOptions,
    cluster: ControlPlane,
    workdir: Path,
    repeat: int,
) -> SteadyRun:
    """`utilisation` of the capacity behind the path, with a keep-alive pool of `connections` per
    replica's worth of load, so that the client's pool is never what queues."""
    used = replicas[:1] if subject == "one replica" else replicas
    rate = options.utilisation * REPLICA_CAPACITY_RPS * len(used)

    async def run(url: str) -> list[Outcome]:
        traffic = Traffic(lambda: [url], "", BODY, rate, options.timeout_s, options.connections * len(used))
        return await traffic.run(options.warmup_s + options.steady_s)

    if subject == "one replica":
        outcomes = await run(f"{used[0].url}{SLOW_PATH}")
    elif subject == "service":
        async with ConnectionBalancer([(r.host, r.port) for r in used]) as balancer:
            outcomes = await run(f"{balancer.url}{SLOW_PATH}")
    else:
        async with routed(cluster, workdir, SLOW_MODEL, used) as stand_in:
            outcomes = await run(f"{stand_in.router.url}{SLOW_PATH}")
    measured = [outcome for outcome in outcomes if outcome.sent_s >= options.warmup_s]
    return SteadyRun(
        subject=subject,
        repeat=repeat,
        replicas=len(used),
        rate_rps=rate,
        requests=len(measured),
        ok=sum(outcome.status == 200 for outcome in measured),
        refused_503=sum(outcome.status == 503 for outcome in measured),
        unanswered=lost(measured),
        p50_ms=latency_ms(measured, 50),
        p99_ms=latency_ms(measured, 99),
    )


async def run_keepalive(
    options: KeepaliveOptions, cluster: ControlPlane, workdir: Path, meta: RunRecord
) -> KeepaliveResult:
    path = servers.write_manifest(workdir, slow_manifest())
    replicas = [
        servers.start_replica(path, workdir, name=f"slow-{n}", host=cluster.address)
        for n in range(options.replicas)
    ]
    steps: list[StepRun] = []
    steadies: list[SteadyRun] = []
    try:
        for replica in replicas:
            await asyncio.to_thread(replica.wait_ready, 180)
        for repeat, subject in interleaved(SUBJECTS, options.repeats):
            kind, _, which = subject.partition(": ")
            print(f"keep-alive, repeat {repeat + 1}/{options.repeats}: {subject}", flush=True)
            if kind == "step":
                steps.append(await step_run(which, replicas, options, cluster, workdir, repeat))
            else:
                steadies.append(await steady_run(which, replicas, options, cluster, workdir, repeat))
            for replica in replicas:
                replica.check_alive()
    finally:
        for replica in replicas:
            replica.stop()
    return KeepaliveResult(meta, dataclasses.asdict(options), steps, steadies)
