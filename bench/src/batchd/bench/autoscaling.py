"""Autoscaling benchmark: what a load step does to an autoscaled BatchedDeployment and to a fixed one.

    python -m batchd.bench.autoscaling                 # the load step, 3 interleaved repeats
    python -m batchd.bench.autoscaling --quick         # smoke-sized: short phases, one repeat
    python -m batchd.bench.autoscaling calibrate       # ongoing items vs utilization, one replica

Why it exists: the autoscaling tests say that replicas come and go; this says how fast, and what
a user's requests see meanwhile. In the same run, taking turns, two subjects get the same load
step (low, then about 4x one replica's capacity, then low again), each on a fresh stand-in
cluster (`batchd.testing.cluster`: real `batchd serve` processes, one per pod, on their own
loopback addresses) with the real operator (`python -m batchd.operator`, its own process)
against the emulated API server:
- `autoscaled`: autoscaling from 1 to 6 replicas with short stabilization windows;
- `fixed`: one replica, no autoscaling.
The handler holds every batch for a fixed time whatever its size (`SlowAdder`, a GPU's fixed
cost per batch), so a replica's capacity is max_batch_size / batch time whatever this machine's
CPU does, and 4x that is only a few hundred small HTTP requests a second: the two shared cores
carry the HTTP work of the load, the replicas and the operator with room to spare.

Every `sample_s` it records the offered rate, the Deployment's desired replicas, the ready
replicas and the total queue (the sum of every ready replica's `GET /load` queued_items); the
windowed p99 comes from the traffic's outcomes afterwards. Figures per subject (medians over
repeats) and one chart (`autoscaling.png`) go to bench/results/. A request that gets no usable
answer (not a 2xx, nor a 503 with Retry-After) fails the run loudly.

`calibrate` measures what the default `target_ongoing_items` (max_batch_size x
max_concurrent_batches) stands for: the mean items a replica holds (queued + running, sampled from
`/load`) at open-loop rates from 25% to 110% of its capacity, for two batch shapes.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import logging
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from batchd.bench import RESULTS_DIR, loadgen, records
from batchd.bench.stats import median, percentile
from batchd.testing import servers
from batchd.testing.apiserver import ApiServer
from batchd.testing.cluster import Cluster
from batchd.testing.manifests import manifest
from batchd.testing.operator_runner import api_server, create, eventually, operator_process
from batchd.testing.traffic import Outcome, Traffic, unanswered

logger = logging.getLogger("batchd.bench.autoscaling")

NS = "default"
HANDLER = "batchd.testing.handlers:SlowAdder"
SUBJECTS = ("autoscaled", "fixed")
START_TIMEOUT_S = 120.0  # a replica's first start on a busy machine
LOAD_TIMEOUT = aiohttp.ClientTimeout(total=1.0)


# -- what is run ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """The traffic: `low_rps` for `before_s`, `high_rps` for `step_s`, `low_rps` for `after_s`."""

    low_rps: float
    high_rps: float
    before_s: float
    step_s: float
    after_s: float

    @property
    def start_s(self) -> float:
        return self.before_s

    @property
    def end_s(self) -> float:
        return self.before_s + self.step_s

    @property
    def duration_s(self) -> float:
        return self.before_s + self.step_s + self.after_s

    def rate(self, elapsed_s: float) -> float:
        return self.high_rps if self.start_s <= elapsed_s < self.end_s else self.low_rps


@dataclass(frozen=True)
class Options:
    repeats: int = 3
    max_batch_size: int = 8
    batch_s: float = 0.1  # SlowAdder's hold per batch: 8 / 0.1 = 80 items/s per replica
    batch_wait_s: float = 0.02
    max_queued: int = 1024  # the spec's default: what a user gets
    min_replicas: int = 1
    max_replicas: int = 6  # 6 x 80 = 480 items/s: room above the 320 of the step
    upscale_delay_s: float = 2.0
    downscale_delay_s: float = 10.0
    poll_s: float = 0.5  # the operator's replica_poll_interval_s (its default is 5 s)
    drain_delay_s: int = 1  # the preStop sleep (default 5 s): endpoints drop a pod first
    step: Step = Step(low_rps=20, high_rps=320, before_s=10, step_s=40, after_s=20)
    sample_s: float = 0.5
    window_s: float = 2.0  # the sliding window of the p99
    carry_factor: float = 2.0  # "carried": windowed p99 under this x the idle p99

    @property
    def capacity_rps(self) -> float:
        """What one replica serves at most: full batches back to back."""
        return self.max_batch_size / self.batch_s


QUICK = Options(
    repeats=1,
    upscale_delay_s=1.0,
    downscale_delay_s=3.0,
    step=Step(low_rps=20, high_rps=320, before_s=3, step_s=10, after_s=8),
)


def subject_manifest(subject: str, options: Options) -> dict[str, Any]:
    model = {"handler": HANDLER, "init_kwargs": {"delay_s": options.batch_s}}
    batching = {
        "max_batch_size": options.max_batch_size,
        "batch_wait_timeout_s": options.batch_wait_s,
        "max_queued_requests": options.max_queued,
    }
    if subject == "fixed":
        return manifest(subject, model, batching=batching, num_replicas=1)
    autoscaling = {
        "min_replicas": options.min_replicas,
        "max_replicas": options.max_replicas,
        "upscale_delay_s": options.upscale_delay_s,
        "downscale_delay_s": options.downscale_delay_s,
    }
    return manifest(subject, model, batching=batching, num_replicas=1, autoscaling=autoscaling)


# -- running one subject -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the traffic started
    desired: int  # the Deployment's spec.replicas: what the operator asked for
    ready: int  # pods Ready and not terminating: what kube-proxy sends traffic to
    queued: int  # sum of queued_items over the ready replicas that answered /load
    running: int  # sum of running_items over the same


async def _load_of(session: aiohttp.ClientSession, url: str) -> tuple[int, int] | None:
    try:
        async with session.get(f"{url}/load", timeout=LOAD_TIMEOUT) as response:
            body = await response.json()
        return int(body["queued_items"]), int(body["running_items"])
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
        return None  # a replica that is going away; it holds nothing the others must serve


async def _sampler(
    server: ApiServer, cluster: Cluster, name: str, started: float, options: Options, samples: list[Sample]
) -> None:
    """One sample every `sample_s` from the traffic's start until it ends (or this is cancelled)."""
    async with aiohttp.ClientSession() as session:
        for index in range(int(options.step.duration_s / options.sample_s) + 1):
            await asyncio.sleep(max(0.0, started + index * options.sample_s - time.monotonic()))
            t = time.monotonic() - started
            pods = [pod for pod in cluster.pods(name) if pod.ready and not pod.terminating]
            loads = [load for load in await asyncio.gather(*(_load_of(session, p.url) for p in pods)) if load]
            deployment = server.get_object("apps/deployments", NS, name) or {}
            desired = int(deployment.get("spec", {}).get("replicas", 0))
            samples.append(Sample(t, desired, len(pods), sum(q for q, _ in loads), sum(r for _, r in loads)))


async def run_subject(subject: str, options: Options, workdir: Path) -> dict[str, Any]:
    """One subject through the whole step on a fresh API server, operator and stand-in cluster."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    env = {
        "BATCHD_REPLICA_POLL_INTERVAL_S": str(options.poll_s),
        "BATCHD_DRAIN_DELAY_S": str(options.drain_delay_s),
    }
    samples: list[Sample] = []
    async with (
        api_server(workdir) as server,
        operator_process(server, workdir / "operator.log", env),
        Cluster(server, workdir / "cluster", config_sync_period_s=0.2) as cluster,
    ):
        await create(server, subject_manifest(subject, options))

        def one_ready() -> bool:
            return sum(pod.ready and not pod.terminating for pod in cluster.pods(subject)) == 1

        await eventually(one_ready, timeout_s=START_TIMEOUT_S, what=f"{subject}: one ready replica")
        if subject == "autoscaled":  # the operator has read the replica: the autoscaler is watching

            def observed() -> bool:
                resource = server.get_object("serving.batchd.dev/batcheddeployments", NS, subject) or {}
                return bool((resource.get("status") or {}).get("autoscaling"))

            await eventually(
                observed, timeout_s=30, what=f"{subject}: the operator reading the replica's load"
            )

        traffic = Traffic(
            lambda: cluster.endpoints(subject),
            f"/v1/models/{subject}:predict",
            b'{"instances": [1]}',
            options.step.rate,
        )
        started = time.monotonic()
        sending = asyncio.create_task(traffic.run(options.step.duration_s))
        sampling = asyncio.create_task(_sampler(server, cluster, subject, started, options, samples))
        try:
            outcomes = await sending
        finally:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)
            if not sending.done():
                traffic.stop()
                await asyncio.gather(sending, return_exceptions=True)
        scale_events = [
            {"reason": event.get("reason"), "message": event.get("message")}
            for event in server.posted_events
            if event.get("reason") in ("ScaledUp", "ScaledDown")
        ]
    return analyse(subject, options, samples, outcomes, scale_events)


# -- turning a run into figures ------------------------------------------------------------------------


def _p99_ms(latencies: Sequence[float]) -> float:
    return percentile(latencies, 99) * 1000  # NaN for none


def series(options: Options, samples: Sequence[Sample], outcomes: Sequence[Outcome]) -> dict[str, list[Any]]:
    """Per sample: the offered rate, what was sent and served (last second), and the windowed p99.

    Latency counts only requests answered 200: a 503 is answered at once, and counting it would
    make an overloaded replica look fast. Requests belong to the moment they were sent.
    """
    ok = sorted((o.sent_s, o.latency_s) for o in outcomes if o.status == 200)
    sent = sorted(o.sent_s for o in outcomes)
    done = sorted(o.sent_s + o.latency_s for o in outcomes if o.status == 200)
    refused = sorted(o.sent_s for o in outcomes if o.status == 503)
    result: dict[str, list[Any]] = {
        key: [] for key in ("t", "offered_rps", "sent_rps", "ok_rps", "refused_rps", "p99_ms")
    }
    ok_sent = [s for s, _ in ok]

    def last_second(times: list[float], t: float) -> int:
        return bisect.bisect_right(times, t) - bisect.bisect_right(times, t - 1)

    for sample in samples:
        t = sample.t
        result["t"].append(round(t, 3))
        result["offered_rps"].append(options.step.rate(t))
        result["sent_rps"].append(last_second(sent, t))
        result["ok_rps"].append(last_second(done, t))
        result["refused_rps"].append(last_second(refused, t))
        lo, hi = bisect.bisect_right(ok_sent, t - options.window_s), bisect.bisect_right(ok_sent, t)
        result["p99_ms"].append(_p99_ms([latency for _, latency in ok[lo:hi]]))
    for key in ("desired", "ready", "queued", "running"):
        result[key] = [getattr(sample, key) for sample in samples]
    return result


def _first_at_or_after(times: Sequence[float], flags: Sequence[bool], since: float) -> float | None:
    for t, flag in zip(times, flags, strict=True):
        if t >= since and flag:
            return t - since
    return None


def _held_from(times: Sequence[float], flags: Sequence[bool], since: float, until: float) -> float | None:
    """Seconds from `since` to the first time after which `flags` holds at every sample up to `until`."""
    first: float | None = None
    for t, flag in zip(times, flags, strict=True):
        if t < since or t > until:
            continue
        if not flag:
            first = None
        elif first is None:
            first = t
    return None if first is None else first - since


def analyse(
    subject: str,
    options: Options,
    samples: Sequence[Sample],
    outcomes: Sequence[Outcome],
    scale_events: list[dict[str, Any]],
) -> dict[str, Any]:
    step = options.step
    data = series(options, samples, outcomes)
    times = data["t"]

    def latencies(since: float, until: float) -> list[float]:
        return [o.latency_s for o in outcomes if o.status == 200 and since <= o.sent_s < until]

    idle_p99 = _p99_ms(latencies(1.0, step.start_s))  # the first second opens connections
    threshold = options.carry_factor * idle_p99
    under = [not math.isnan(p) and p <= threshold for p in data["p99_ms"]]
    enough = [ready * options.capacity_rps >= step.high_rps for ready in data["ready"]]
    # The autoscaler's own aim: each ready replica holds no more than target_ongoing_items queued.
    short = [
        queued <= options.max_batch_size * ready
        for queued, ready in zip(data["queued"], data["ready"], strict=True)
    ]
    lost = unanswered(outcomes)
    in_step = [o for o in outcomes if step.start_s <= o.sent_s < step.end_s]
    at_min = [
        desired == options.min_replicas and ready == options.min_replicas
        for desired, ready in zip(data["desired"], data["ready"], strict=True)
    ]
    step_latencies = latencies(step.start_s, step.end_s)
    figures = {
        "requests": len(outcomes),
        "ok": sum(o.status == 200 for o in outcomes),
        "refused_503": sum(o.status == 503 for o in outcomes),
        "refused_503_in_step": sum(o.status == 503 for o in in_step),
        "unanswered": len(lost),
        "unanswered_examples": [asdict(o) for o in lost[:5]],
        "idle_p99_ms": idle_p99,
        "step_p50_ms": percentile(step_latencies, 50) * 1000,
        "step_p99_ms": _p99_ms(step_latencies),
        # Answers that arrived within the step (a backlog answered later belongs to later).
        "step_ok_rps": sum(
            o.status == 200 and step.start_s <= o.sent_s + o.latency_s < step.end_s for o in outcomes
        )
        / step.step_s,
        "peak_desired": max(data["desired"], default=0),
        "peak_ready": max(data["ready"], default=0),
        "peak_queued": max(data["queued"], default=0),
        # Seconds after the step began: the first larger ask, enough ready capacity, carried.
        "scale_up_decided_s": _first_at_or_after(times, [d > 1 for d in data["desired"]], step.start_s),
        "capacity_ready_s": _first_at_or_after(times, enough, step.start_s),
        "carried_s": _held_from(times, under, step.start_s, step.end_s),
        # Seconds after the step ended until the count is back at min_replicas (and stays).
        "back_to_min_s": _held_from(times, at_min, step.end_s, step.duration_s + 1)
        if subject == "autoscaled"
        else math.nan,
        "queue_under_target_s": _held_from(times, short, step.start_s, step.end_s),
    }
    return {"subject": subject, "figures": figures, "series": data, "scale_events": scale_events}


FIGURES = (
    # (key, label, unit) as the report lists them
    ("idle_p99_ms", "p99 before the step", "ms"),
    ("step_p50_ms", "p50 during the step", "ms"),
    ("step_p99_ms", "p99 during the step", "ms"),
    ("step_ok_rps", "answered 200 during the step", "req/s"),
    ("refused_503_in_step", "refused (503) during the step", ""),
    ("unanswered", "without a usable answer", ""),
    ("peak_ready", "peak ready replicas", ""),
    ("peak_queued", "peak total queue", "items"),
    ("scale_up_decided_s", "step -> first scale-up", "s"),
    ("capacity_ready_s", "step -> ready capacity >= offered", "s"),
    ("queue_under_target_s", "step -> queue under target", "s"),
    ("carried_s", "step -> load carried", "s"),
    ("back_to_min_s", "step end -> back to min_replicas", "s"),
)


# Figures about scaling decisions, which a subject without autoscaling does not make.
AUTOSCALING_ONLY = ("scale_up_decided_s", "back_to_min_s")


def summarise(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats; a time that never came (None) counts as +inf, so a median of
    'never' is reported as never rather than dropped."""
    summary: dict[str, Any] = {}
    for key, _, _ in FIGURES:
        values = [run["figures"][key] for run in runs]
        if key == "unanswered":
            summary[key] = sum(values)
            continue
        numbers = [math.inf if value is None else float(value) for value in values]
        middle = median(numbers)
        summary[key] = None if math.isinf(middle) else middle
        summary[f"{key}_runs"] = values
    return summary


# -- the load step, end to end -----------------------------------------------------------------------


async def run_step(options: Options, workdir: Path) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {subject: [] for subject in SUBJECTS}
    for repeat in range(options.repeats):
        # Alternate which goes first, so a slow patch of a shared machine falls on both.
        order = SUBJECTS if repeat % 2 == 0 else tuple(reversed(SUBJECTS))
        for subject in order:
            logger.info("repeat %d/%d: %s", repeat + 1, options.repeats, subject)
            run = await run_subject(subject, options, workdir / f"{subject}-{repeat}")
            run["repeat"] = repeat
            figures = run["figures"]
            logger.info(
                "  %s: p99 in step %.0f ms, 503s %d, unanswered %d, peak ready %d, carried after %s s",
                subject,
                figures["step_p99_ms"],
                figures["refused_503_in_step"],
                figures["unanswered"],
                figures["peak_ready"],
                figures["carried_s"],
            )
            runs[subject].append(run)
    return {
        "options": _options_dict(options),
        "summary": {subject: summarise(runs[subject]) for subject in SUBJECTS},
        "runs": runs,
    }


def _options_dict(options: Options) -> dict[str, Any]:
    found = asdict(options)
    found["capacity_rps"] = options.capacity_rps
    found["target_ongoing_items"] = options.max_batch_size  # the default: one batch per batch slot
    return found


# -- calibration: ongoing items against utilization --------------------------------------------------

CALIBRATION_SHAPES = ((8, 0.1), (32, 0.2))  # (max_batch_size, seconds per batch)
CALIBRATION_UTILIZATIONS = (0.25, 0.50, 0.70, 0.85, 0.95, 1.10)


async def _ongoing_during(
    host: str, port: int, rate_rps: float, duration_s: float, warmup_s: float, interval_s: float = 0.05
) -> tuple[loadgen.RunResult, list[tuple[int, int]]]:
    """Open-loop load at `rate_rps`, with the replica's /load sampled every `interval_s` after warm-up."""
    request = loadgen.Request.post_json(host, port, "/v1/models/calibrate:predict", b'{"instances": [1]}')
    probe = loadgen.Request.get(host, port, "/load")
    samples: list[tuple[int, int]] = []

    async def sample() -> None:
        connection = await loadgen.Connection.open(host, port)
        try:
            await asyncio.sleep(warmup_s)
            while True:
                _, body = await connection.call(probe)
                load = json.loads(body)
                samples.append((int(load["queued_items"]), int(load["running_items"])))
                await asyncio.sleep(interval_s)
        finally:
            connection.close()

    sampling = asyncio.create_task(sample())
    try:
        result = await loadgen.open_loop(host, port, request, rate_rps, duration_s + warmup_s)
    finally:
        sampling.cancel()
        await asyncio.gather(sampling, return_exceptions=True)
    return result, samples


async def _drained(host: str, port: int, timeout_s: float = 120) -> None:
    """Wait until the replica holds nothing, so that one rate's backlog is not the next one's."""
    connection = await loadgen.Connection.open(host, port)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            _, body = await connection.call(loadgen.Request.get(host, port, "/load"))
            load = json.loads(body)
            if load["queued_items"] == 0 and load["running_items"] == 0:
                return
            await asyncio.sleep(0.1)
    finally:
        connection.close()


def calibrate(duration_s: float, warmup_s: float, workdir: Path, batch_wait_s: float) -> list[dict[str, Any]]:
    """For each shape and utilization: mean ongoing items, as a multiple of max_batch_size."""
    rows: list[dict[str, Any]] = []
    for max_batch, batch_s in CALIBRATION_SHAPES:
        capacity = max_batch / batch_s
        document = manifest(
            "calibrate",
            {"handler": HANDLER, "init_kwargs": {"delay_s": batch_s}},
            batching={"max_batch_size": max_batch, "batch_wait_timeout_s": batch_wait_s},
        )
        path = servers.write_manifest(workdir / f"b{max_batch}", document)
        with servers.replica_process(path, workdir / f"b{max_batch}") as replica:
            for utilization in CALIBRATION_UTILIZATIONS:
                rate = capacity * utilization
                result, samples = uvloop.run(
                    _ongoing_during(replica.host, replica.port, rate, duration_s, warmup_s)
                )
                ongoing = [queued + running for queued, running in samples]
                half = len(ongoing) // 2
                first, second = ongoing[:half], ongoing[half:]
                mean_latency_s = (
                    sum(result.latencies_s) / len(result.latencies_s) if result.latencies_s else 0
                )
                row = {
                    "max_batch_size": max_batch,
                    "batch_s": batch_s,
                    "capacity_rps": capacity,
                    "utilization": utilization,
                    "rate_rps": rate,
                    "served_rps": result.throughput_rps,
                    "errors": result.errors,
                    "samples": len(ongoing),
                    "mean_ongoing": sum(ongoing) / len(ongoing) if ongoing else math.nan,
                    "mean_queued": sum(q for q, _ in samples) / len(samples) if samples else math.nan,
                    "mean_running": sum(r for _, r in samples) / len(samples) if samples else math.nan,
                    # Growing without bound shows as a second half well above the first.
                    "first_half_ongoing": sum(first) / len(first) if first else math.nan,
                    "second_half_ongoing": sum(second) / len(second) if second else math.nan,
                    "p50_ms": percentile(result.latencies_s, 50) * 1000,
                    "p99_ms": percentile(result.latencies_s, 99) * 1000,
                    # Little's law: items in the system = arrival rate x time in it (a cross-check).
                    "littles_law_items": result.throughput_rps * mean_latency_s,
                }
                row["ongoing_over_batch"] = row["mean_ongoing"] / max_batch
                rows.append(row)
                logger.info(
                    "batch %d @ %.1f s, %.0f%% (%.0f req/s): ongoing %.1f = %.2f x max_batch_size",
                    max_batch,
                    batch_s,
                    utilization * 100,
                    rate,
                    row["mean_ongoing"],
                    row["ongoing_over_batch"],
                )
                uvloop.run(_drained(replica.host, replica.port))
    return rows


# -- reports -----------------------------------------------------------------------------------------


def _number(value: Any, unit: str = "") -> str:
    """A figure as the report prints it, without its unit; None is a time that never came."""
    if value is None:
        return "never"
    if isinstance(value, float) and math.isnan(value):
        return "-"
    if isinstance(value, float) and (unit == "s" or not value.is_integer()):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"
    if isinstance(value, float):  # a median of counts
        return f"{value:,.0f}"
    return f"{value:,}"


def _fmt(value: Any, unit: str = "") -> str:
    text = _number(value, unit)
    return f"{text} {unit}" if unit and text not in ("never", "-") else text


def step_markdown(step: dict[str, Any]) -> str:
    o = step["options"]
    s = o["step"]
    lines = [
        "## Load step: autoscaled vs one fixed replica",
        "",
        f"Handler: SlowAdder, {o['batch_s']} s per batch of up to {o['max_batch_size']} "
        f"(one replica serves at most {o['capacity_rps']:.0f} items/s), batch wait {o['batch_wait_s']} s, "
        f"max_queued_requests {o['max_queued']}. Traffic (open loop, one item per request): "
        f"{s['low_rps']:g} req/s for {s['before_s']:g} s, {s['high_rps']:g} req/s "
        f"({s['high_rps'] / o['capacity_rps']:.1f}x one replica) for {s['step_s']:g} s, "
        f"{s['low_rps']:g} req/s for {s['after_s']:g} s. Autoscaled: min {o['min_replicas']}, "
        f"max {o['max_replicas']}, target_ongoing_items {o['target_ongoing_items']} (the default), "
        f"upscale_delay_s {o['upscale_delay_s']:g}, downscale_delay_s {o['downscale_delay_s']:g}; "
        f"the operator polls every {o['poll_s']:g} s (its default is 5 s); preStop sleep "
        f"{o['drain_delay_s']} s. Medians of {o['repeats']} interleaved repeats (each repeat's "
        "values in brackets).",
        "",
        f"Definitions: *p99* counts requests answered 200, by the moment they were sent (503s are "
        f"answered at once and counted apart). *load carried*: the first moment after which the p99 "
        f"over a sliding {o['window_s']:g} s window stays under {o['carry_factor']:g}x the p99 "
        f"before the step until the step ends (samples every {o['sample_s']:g} s). *ready capacity >= "
        f"offered*: ready replicas x {o['capacity_rps']:.0f} items/s >= {s['high_rps']:g} req/s. "
        f"*queue under target*: the first moment after which the total queue stays at or under "
        f"{o['target_ongoing_items']} items per ready replica until the step ends. "
        "*never*: not before the step ended. "
        "*Without a usable answer*: neither a 2xx nor a 503 with Retry-After (must be 0).",
        "",
        "| figure | autoscaled | fixed (1 replica) |",
        "|---|---:|---:|",
    ]
    for key, label, unit in FIGURES:
        cells = []
        for subject in SUBJECTS:
            if subject == "fixed" and key in AUTOSCALING_ONLY:
                cells.append("n/a")
                continue
            summary = step["summary"][subject]
            text = _fmt(summary.get(key, math.nan), unit)
            runs = summary.get(f"{key}_runs")
            if runs is not None and len(runs) > 1:
                text += " (" + ", ".join(_number(v, unit) for v in runs) + ")"
            cells.append(text)
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def calibration_markdown(calibration: dict[str, Any]) -> str:
    lines = [
        "## Calibration: items a replica holds against its utilization",
        "",
        f"One replica (SlowAdder, batch wait {calibration['batch_wait_s']} s, one batch at a time), "
        f"open-loop load for {calibration['duration_s']:g} s per rate after {calibration['warmup_s']:g} s "
        "of warm-up; ongoing = queued + running items from `GET /load` every 50 ms. Little's law "
        "(served rate x mean latency) cross-checks the mean.",
        "",
        "| shape | utilization | offered req/s | served req/s | mean ongoing | x max_batch_size "
        "| 1st half / 2nd half | Little's law | p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in calibration["rows"]:
        # Past capacity the queue grows for as long as the load lasts: the mean is only where it got to.
        growing = row["second_half_ongoing"] - row["first_half_ongoing"] > row["max_batch_size"]
        lines.append(
            f"| {row['max_batch_size']} @ {row['batch_s']} s | {row['utilization']:.0%} "
            f"| {row['rate_rps']:.0f} | {row['served_rps']:.0f} | {row['mean_ongoing']:.1f} "
            f"| {row['ongoing_over_batch']:.2f}{' (growing)' if growing else ''} "
            f"| {row['first_half_ongoing']:.1f} / "
            f"{row['second_half_ongoing']:.1f} | {row['littles_law_items']:.1f} "
            f"| {row['p50_ms']:.0f} | {row['p99_ms']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def to_markdown(results: dict[str, Any]) -> str:
    parts = ["# Autoscaling benchmark\n"]
    if "step" in results:
        parts += [_ran(results["step"]), step_markdown(results["step"]), "![load step](autoscaling.png)\n"]
    if "calibration" in results:
        parts += [_ran(results["calibration"]), calibration_markdown(results["calibration"])]
    return "\n".join(parts)


def _ran(section: dict[str, Any]) -> str:
    meta = section["meta"]
    return f"`{meta['command']}` ({meta['date']}, {meta['machine']})\n"


def write_results(output_dir: Path, section: str, value: dict[str, Any]) -> dict[str, Any]:
    """Replace one section (`step` or `calibration`) of autoscaling.json, keep the other, and
    rewrite autoscaling.md from both: the two modes run separately but report together."""
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / "autoscaling.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    results[section] = value
    records.write_json(path, results)
    (output_dir / "autoscaling.md").write_text(to_markdown(results))
    return results


# -- the chart ---------------------------------------------------------------------------------------

COLORS = {"autoscaled": "tab:blue", "fixed": "tab:orange"}


def _median_series(runs: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """Sample by sample (the samples of every run share the grid), the median over repeats."""
    length = min(len(run["series"]["t"]) for run in runs)
    times = [median([run["series"]["t"][i] for run in runs]) for i in range(length)]
    values = [
        median([math.nan if run["series"][key][i] is None else run["series"][key][i] for run in runs])
        for i in range(length)
    ]
    return times, values


def draw_chart(step: dict[str, Any], path: Path) -> None:
    """Four panels on one time axis: load, replicas, queue, windowed p99; both subjects on each."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    options = step["options"]
    shape = options["step"]
    figure, axes = plt.subplots(4, 1, sharex=True, figsize=(10, 11), constrained_layout=True)
    load_ax, replicas_ax, queue_ax, p99_ax = axes
    for subject in SUBJECTS:
        runs = step["runs"][subject]
        color = COLORS[subject]
        label = "autoscaled (1-6)" if subject == "autoscaled" else "fixed (1 replica)"
        for key, ax, style, what in (
            ("ok_rps", load_ax, "-", "answered 200/s"),
            ("ready", replicas_ax, "-", "ready"),
            ("desired", replicas_ax, "--", "desired"),
            ("queued", queue_ax, "-", None),
            ("p99_ms", p99_ax, "-", None),
        ):
            for run in runs:  # each repeat faintly, the median boldly
                ax.plot(run["series"]["t"], run["series"][key], style, color=color, alpha=0.2, lw=0.8)
            times, values = _median_series(runs, key)
            ax.plot(times, values, style, color=color, lw=1.8, label=f"{label}: {what}" if what else label)
    times, offered = _median_series(step["runs"]["autoscaled"], "offered_rps")
    load_ax.plot(times, offered, color="black", lw=1.2, label="offered (both)")
    load_ax.axhline(options["capacity_rps"], color="grey", ls=":", lw=1)
    load_ax.annotate("one replica's capacity", (1, options["capacity_rps"]), color="grey", fontsize=8)
    idle = [step["summary"][s]["idle_p99_ms"] for s in SUBJECTS if step["summary"][s]["idle_p99_ms"]]
    if idle:
        threshold = options["carry_factor"] * median(idle)
        p99_ax.axhline(threshold, color="grey", ls=":", lw=1)
        p99_ax.annotate(
            f"{options['carry_factor']:g}x idle p99 ('carried')",
            (1, threshold * 1.1),
            color="grey",
            fontsize=8,
        )
    load_ax.set_ylabel("requests/s")
    load_ax.set_title("load")
    replicas_ax.set_ylabel("replicas")
    replicas_ax.set_title("replicas (solid: ready, dashed: desired)")
    queue_ax.set_ylabel("items queued")
    queue_ax.set_yscale("symlog", linthresh=10)
    queue_ax.set_ylim(bottom=0)
    queue_ax.set_title("total queue depth (sum of ready replicas' /load queued_items)")
    p99_ax.set_ylabel("ms")
    p99_ax.set_yscale("log")
    p99_ax.set_title(f"p99 latency of 200s, sliding {options['window_s']:g} s window, by send time")
    p99_ax.set_xlabel("seconds since the traffic started")
    for ax in axes:
        ax.axvspan(shape["before_s"], shape["before_s"] + shape["step_s"], color="grey", alpha=0.08)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    figure.suptitle(
        f"Load step {shape['low_rps']:g} -> {shape['high_rps']:g} -> {shape['low_rps']:g} req/s "
        f"(shaded), SlowAdder {options['max_batch_size']} items / {options['batch_s']} s; "
        f"medians of {options['repeats']} repeats (faint: each repeat)",
        fontsize=10,
    )
    figure.savefig(path, dpi=110)
    plt.close(figure)


# -- the command -------------------------------------------------------------------------------------


def _meta(argv: Sequence[str]) -> dict[str, Any]:
    return records.run_meta("batchd.bench.autoscaling", argv)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m batchd.bench.autoscaling", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("mode", nargs="?", choices=("step", "calibrate"), default="step")
    parser.add_argument("--quick", action="store_true", help="smoke-sized: short phases, one repeat")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3)")
    parser.add_argument("--poll-s", type=float, default=None, help="the operator's poll interval (0.5)")
    parser.add_argument(
        "--max-queued", type=int, default=None, help="both subjects' max_queued_requests (the default 1024)"
    )
    parser.add_argument("--duration-s", type=float, default=None, help="calibrate: seconds per rate (20)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs and pod folders here")
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats: expected 1 or more, got {args.repeats}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    # Not every request of the emulated API server, nor every readiness check of a starting replica.
    for noisy in ("aiohttp.access", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="batchd-autoscaling-") as temporary:
        workdir = args.workdir or Path(temporary)
        if args.mode == "calibrate":
            return _calibrate_command(args, argv, workdir)
        return _step_command(args, argv, workdir)


def _step_command(args: argparse.Namespace, argv: Sequence[str], workdir: Path) -> int:
    options = QUICK if args.quick else Options()
    if args.repeats is not None:
        options = replace(options, repeats=args.repeats)
    if args.poll_s is not None:
        options = replace(options, poll_s=args.poll_s)
    if args.max_queued is not None:
        options = replace(options, max_queued=args.max_queued)
    step = asyncio.run(run_step(options, workdir))
    step["meta"] = _meta(argv)
    write_results(args.output_dir, "step", step)
    draw_chart(step, args.output_dir / "autoscaling.png")
    print(step_markdown(step))
    print(f"results: {args.output_dir / 'autoscaling.json'}, .md and .png")
    lost = {subject: step["summary"][subject]["unanswered"] for subject in SUBJECTS}
    if any(lost.values()):
        examples = [
            example
            for subject in SUBJECTS
            for run in step["runs"][subject]
            for example in run["figures"]["unanswered_examples"]
        ]
        print(f"FAILED: requests without a usable answer: {lost}; e.g. {examples[:3]}", file=sys.stderr)
        return 1
    return 0


def _calibrate_command(args: argparse.Namespace, argv: Sequence[str], workdir: Path) -> int:
    duration_s = args.duration_s or (2.0 if args.quick else 20.0)
    warmup_s = 1.0 if args.quick else 3.0
    batch_wait_s = Options().batch_wait_s
    rows = calibrate(duration_s, warmup_s, workdir, batch_wait_s)
    calibration = {
        "meta": _meta(argv),
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "batch_wait_s": batch_wait_s,
        "rows": rows,
    }
    write_results(args.output_dir, "calibration", calibration)
    print(calibration_markdown(calibration))
    errors = sum(row["errors"] for row in rows)
    if errors:
        print(f"FAILED: {errors} request(s) failed during calibration", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
