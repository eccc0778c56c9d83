"""Scale from zero, router side: a deployment with no replica gets traffic; the router holds it
while a stand-in for the operator notices (the router's `GET /held`, read every `poll_s`, the
operator's default poll interval) and starts a replica; held requests go to it once it is ready.

The stand-in publishes the replica's EndpointSlice as soon as a readiness probe (every
`probe_s`) passes, as the kubelet and the EndpointSlice controller would. What is timed against
what: the first request's wait, against the replica's own start (process started -> ready).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

from batchd.bench.kit.handlers import TRIVIAL_ADDER
from batchd.bench.kit.records import RunRecord
from batchd.bench.router.analysis import ZeroResult, ZeroRun, first_at_least
from batchd.bench.router.options import ZeroOptions
from batchd.bench.router.standin import Routed, routed
from batchd.testing import servers
from batchd.testing.kubernetes.controlplane import ControlPlane
from batchd.testing.manifests import manifest
from batchd.testing.servers import ServerProcess, is_ready
from batchd.testing.traffic import Outcome, Traffic

MODEL = "cold"
PATH = f"/v1/models/{MODEL}:predict"


class StandInOperator:
    """Reads the router's `GET /held` every `poll_s`; on demand, starts one replica and publishes
    it once ready. Times are seconds on the load's clock (`time.perf_counter() - start`)."""

    def __init__(
        self, stand_in: Routed, manifest_path: Path, workdir: Path, options: ZeroOptions, start: float
    ):
        self.stand_in, self.manifest_path, self.workdir = stand_in, manifest_path, workdir
        self.options, self.start = options, start
        self.replica: ServerProcess | None = None
        self.noticed_at = self.started_at = self.ready_at = self.published_at = float("nan")

    def now(self) -> float:
        return time.perf_counter() - self.start

    async def run(self, first_poll_s: float) -> None:
        await asyncio.sleep(max(0.0, first_poll_s - self.now()))
        # A poll, as the operator's: nothing would set an event when the router starts holding.
        while await self.stand_in.held() == 0:  # noqa: ASYNC110
            await asyncio.sleep(self.options.poll_s)
        self.noticed_at = self.now()
        self.replica = servers.start_replica(
            self.manifest_path, self.workdir, name="cold", host=self.stand_in.namespaces.host
        )
        self.started_at = self.now()
        while not await asyncio.to_thread(is_ready, self.replica.url):
            self.replica.check_alive()
            await asyncio.sleep(self.options.probe_s)
        self.ready_at = self.now()
        await self.stand_in.publish(self.replica)
        self.published_at = self.now()


async def _sample_held(stand_in: Routed, every_s: float, start: float, into: list[tuple[float, int]]) -> None:
    while True:
        into.append((time.perf_counter() - start, await stand_in.held()))
        await asyncio.sleep(every_s)


def _fine(outcome: Outcome, bound_s: float) -> bool:
    """Answered 200, or refused with Retry-After after waiting out the hold bound (as promised)."""
    if outcome.status == 200:
        return True
    late = outcome.latency_s >= bound_s * 0.99
    return outcome.status == 503 and outcome.retry_after is not None and late


def zero_run(
    repeat: int,
    operator: StandInOperator,
    outcomes: list[Outcome],
    held: list[tuple[float, int]],
    options: ZeroOptions,
) -> ZeroRun:
    """The figures of one cold start, from what the stand-in and the client saw."""
    first = min(outcomes, key=lambda outcome: outcome.sent_s)
    answered_at = sorted(o.sent_s + o.latency_s for o in outcomes if o.status == 200)
    times = [t for t, _ in held]
    answered = [sum(1 for a in answered_at if a <= t) for t in times]
    released = first_at_least(times, [float(n) for n in answered], 1)
    return ZeroRun(
        repeat=repeat,
        requests=len(outcomes),
        ok=sum(o.status == 200 for o in outcomes),
        lost=sum(not _fine(o, options.hold_timeout_s) for o in outcomes),
        load_s=operator.ready_at - operator.started_at,
        first_answer_s=first.latency_s if first.status == 200 else float("nan"),
        noticed_s=operator.noticed_at - first.sent_s,
        ready_s=operator.ready_at - first.sent_s,
        released_s=(answered_at[0] if answered_at else float("nan")) - operator.published_at,
        peak_held=max((n for _, n in held), default=0),
        series={
            "t": [round(t, 3) for t in times],
            "held": [float(n) for _, n in held],
            "answered": [float(n) for n in answered],
            "released_t": [released if released is not None else float("nan")],
        },
    )


async def run_zero(options: ZeroOptions, cluster: ControlPlane, workdir: Path, meta: RunRecord) -> ZeroResult:
    model = {"handler": TRIVIAL_ADDER, "device": "cpu"}
    manifest_path = servers.write_manifest(workdir, manifest(MODEL, model))
    settings = {"hold_timeout_s": options.hold_timeout_s, "max_held_per_deployment": options.max_held}
    runs: list[ZeroRun] = []
    for repeat in range(options.repeats):
        print(f"scale from zero, repeat {repeat + 1}/{options.repeats}", flush=True)
        operator: StandInOperator | None = None
        try:
            async with routed(cluster, workdir, MODEL, (), **settings) as stand_in:
                start = time.perf_counter()
                operator = StandInOperator(stand_in, manifest_path, workdir, options, start)
                held: list[tuple[float, int]] = []
                sampler = asyncio.ensure_future(_sample_held(stand_in, options.sample_s, start, held))
                # The operator's poll has no phase relative to a first request: the repeats spread
                # the first poll evenly over one interval, so their mean wait is half an interval.
                first_poll_s = options.poll_s * (repeat + 0.5) / options.repeats
                waker = asyncio.ensure_future(operator.run(first_poll_s))
                try:
                    # No bound on connections: what waits is held by the router, not the client.
                    traffic = Traffic(
                        lambda: [stand_in.router.url], PATH, b'{"instances": [1]}', options.rate_rps,
                        options.hold_timeout_s + 10,
                    )  # fmt: skip
                    outcomes = await traffic.run(options.seconds, start)
                    await waker
                finally:
                    for task in (sampler, waker):
                        task.cancel()
                    await asyncio.gather(sampler, waker, return_exceptions=True)
        finally:
            # After the router: a replica the router holds connections to takes a second more to stop.
            if operator is not None and operator.replica is not None:
                operator.replica.stop()
        assert operator is not None  # else the router did not start, and the run raised
        runs.append(zero_run(repeat, operator, outcomes, held, options))
    return ZeroResult(meta, dataclasses.asdict(options), runs)
