"""Adaptive batching benchmark (issue 12): `latency_objective_s` against fixed batch windows.

    python -m batchd.bench.adaptive                   # both models, 3 interleaved repeats
    python -m batchd.bench.adaptive --quick           # smoke-sized: cost-curve handler, one repeat
    python -m batchd.bench.adaptive --models costcurve --repeats 2

For each model, five real replicas (`batchd serve`, one process each, `max_batch_size` 32, one
batch at a time) take turns under the same loads:
- four with a fixed window (`batch_wait_timeout_s` 0, 2, 10 and 50 ms, no objective);
- one adaptive (`latency_objective_s`), its objective `objective_factor` (2) times the time of a
  full batch at the measured capacity: near capacity an item may wait for a full batch already in
  the model and then ride in its own, so that is the tightest objective every rate up to capacity
  can keep; it is derived in the run, not chosen per result.
Models: `costcurve`, a handler whose every batch of n items takes exactly 20 ms + 1 ms x n
(`batchd.bench.handlers:CostCurve`; 32 / 52 ms = 615 items/s at most), one batch at a time;
`costcurve-shared`, the same curve with two batch slots (`max_concurrent_batches: 2`) that take
turns on one device, as two batches on one GPU do: there a batch sent beside a running one only
queues for the device and a small one wastes it, which is where a window pays under load; and
MiniLM-L6 embeddings on the CPU (the bundled model, as in the main benchmark), one at a time.

Capacity is measured first, in the same run: a closed loop of 64 clients against the 0 ms
window (full batches back to back), the best of three (a neighbour's burst of CPU on this shared
machine can only lower a run). The loads are open loops at 10, 50, 80
and 95% of it, and a bursty one: on/off, `burst_fraction` (120%) of capacity for 2 s, then 2 s
of nothing, four times. Arrivals are Poisson (seeded: every subject of a repeat gets the same
arrival times): evenly spaced arrivals never bunch, which hides what a window is for. Latency
counts from when a request was due (no coordinated omission); each open loop runs
`warmup_s` at its rate before the measured part. Subjects take turns within each repeat (the
order rotates from one repeat to the next) and the report quotes medians over repeats. While
every run goes, the replica's /metrics is sampled: batch sizes, waits, and for the adaptive
replica what it learned and chose (`batchd_batch_cost_*`, `batchd_arrival_rate`,
`batchd_planned_batch_size`, `batchd_objective_*`); the bursty runs keep it as a time series.

The goals (issue 12), checked per model: at every load, the adaptive replica's p99 within 10%
of the best fixed window's and its throughput within 5% of the best; and on the mix of loads it
beats every fixed window. *The mix*: the five loads weigh the same; a subject's score is the
mean over them of its p99 divided by the best p99 any subject reached at that load (1.0 = best
everywhere); the adaptive replica must score lower than each fixed window.
Results: bench/results/adaptive.{json,md,png}, written after each model; a run of some models
(`--models minilm`) replaces theirs and keeps the others'.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import uvloop
from prometheus_client.parser import text_string_to_metric_families

from batchd.bench import RESULTS_DIR, ceiling, loadgen, promtext, records
from batchd.bench.stats import latency_summary, median
from batchd.testing import manifests, servers
from batchd.testing.models import MINILM_SOURCE, minilm_mirror

logger = logging.getLogger("batchd.bench.adaptive")

SHARED_DEVICE = "costcurve-shared"
MODELS = ("costcurve", SHARED_DEVICE, "minilm")
TITLES = {
    "costcurve": "Cost-curve handler, one batch at a time",
    SHARED_DEVICE: "Cost-curve handler, two batch slots on one device",
    "minilm": "MiniLM-L6 embeddings (CPU)",
}
# max_concurrent_batches per model: two slots that share one device (batches take turns on it)
# are where a window can pay, since a small batch sent beside a running one only wastes the device.
SLOTS = {SHARED_DEVICE: 2}
BURSTY = "bursty"
ADAPTIVE = "adaptive"
MAX_CONNECTIONS = 1024  # the bursty load's backlog holds a few hundred requests open at once


@dataclass(frozen=True)
class Options:
    models: tuple[str, ...] = MODELS
    fractions: tuple[float, ...] = (0.1, 0.5, 0.8, 0.95)  # open-loop rates, of capacity
    windows_ms: tuple[float, ...] = (0.0, 2.0, 10.0, 50.0)
    repeats: int = 3
    duration_s: float = 10.0  # measured, per open-loop run ...
    min_requests: int = 600  # ... longer where it would measure fewer (a p99 needs a few hundred)
    warmup_s: float = 2.0  # at the run's rate, before the measured part
    burst_fraction: float = 1.2
    burst_on_s: float = 2.0
    burst_off_s: float = 2.0
    burst_cycles: int = 4
    capacity_runs: int = 3
    capacity_s: float = 3.0
    capacity_clients: int = 64
    objective_factor: float = 2.0  # the adaptive objective: this many full batches at capacity
    max_batch_size: int = 32
    alpha_s: float = 0.020  # the cost curve: alpha + beta * n seconds per batch of n
    beta_s: float = 0.001
    arrivals: str = "poisson"  # or "uniform" (evenly spaced, as loadgen.open_loop sends)
    sample_s: float = 0.2  # /metrics sampling during every run
    grace_s: float = 15.0  # answers later than this after the last arrival are given up
    pause_s: float = 0.5  # between runs
    seed: int = 12

    @property
    def subjects(self) -> tuple[str, ...]:
        return (*(window_subject(ms) for ms in self.windows_ms), ADAPTIVE)

    @property
    def loads(self) -> tuple[str, ...]:
        return (*(load_name(f) for f in self.fractions), BURSTY)

    @property
    def burst_period_s(self) -> float:
        return self.burst_on_s + self.burst_off_s


QUICK = Options(
    models=("costcurve",),
    repeats=1,
    duration_s=2.0,
    min_requests=0,
    warmup_s=0.5,
    burst_on_s=1.0,
    burst_off_s=1.0,
    burst_cycles=2,
    capacity_runs=1,
    capacity_s=2.0,
    grace_s=10.0,
    pause_s=0.2,
)


def window_subject(ms: float) -> str:
    return f"{ms:g} ms"


def load_name(fraction: float) -> str:
    return f"{fraction * 100:g}%"


# -- what is served ------------------------------------------------------------------------------------


def is_cost_curve(model: str) -> bool:
    return model.startswith("costcurve")


def model_block(model: str, options: Options) -> dict[str, Any]:
    if is_cost_curve(model):
        init_kwargs = {
            "alpha_s": options.alpha_s,
            "beta_s": options.beta_s,
            "shared_device": model == SHARED_DEVICE,
        }
        return {
            "name": model,
            "handler": "batchd.bench.handlers:CostCurve",
            "init_kwargs": init_kwargs,
            "device": "cpu",
        }
    return {"name": model, "task": "feature-extraction", "source": MINILM_SOURCE, "device": "cpu"}


def subject_manifest(model: str, subject: str, options: Options, objective_s: float | None) -> dict[str, Any]:
    batching: dict[str, Any] = {
        "max_batch_size": options.max_batch_size,
        "max_concurrent_batches": SLOTS.get(model, 1),
        "max_queued_requests": 4096,
        "request_timeout_s": 60,
    }
    if subject == ADAPTIVE:
        assert objective_s is not None
        batching["latency_objective_s"] = objective_s
    else:
        batching["batch_wait_timeout_s"] = float(subject.removesuffix(" ms")) / 1000
    slug = "adaptive" if subject == ADAPTIVE else f"w{subject.removesuffix(' ms')}".replace(".", "-")
    return manifests.manifest(f"{model}-{slug}", model_block(model, options), batching=batching)


def request_for(model: str, server: servers.ServerProcess) -> loadgen.Request:
    item: Any = 1 if is_cost_curve(model) else ceiling.SENTENCE
    body = json.dumps({"instances": [item]}).encode()
    return loadgen.Request.post_json(server.host, server.port, f"/v1/models/{model}:predict", body)


# -- the loads -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """When each request is due (seconds from the start); those due before `measure_from_s` warm up."""

    dues: tuple[float, ...]
    measure_from_s: float
    measured_s: float  # the length of the measured part


def arrivals_between(start: float, end: float, rate: float, rng: random.Random, arrivals: str) -> list[float]:
    """Arrival times in [start, end): a Poisson process at `rate`, or evenly spaced from `start`."""
    if arrivals == "uniform":
        return [start + i / rate for i in range(math.ceil((end - start) * rate - 1e-9))]
    dues: list[float] = []
    t = start + rng.expovariate(rate)
    while t < end:
        dues.append(t)
        t += rng.expovariate(rate)
    return dues


def steady(rate: float, warmup_s: float, duration_s: float, rng: random.Random, arrivals: str) -> Schedule:
    dues = arrivals_between(0.0, warmup_s + duration_s, rate, rng, arrivals)
    return Schedule(tuple(dues), warmup_s, duration_s)


def bursty(rate: float, options: Options, rng: random.Random) -> Schedule:
    """`rate` for burst_on_s, nothing for burst_off_s, burst_cycles times; all of it measured."""
    dues: list[float] = []
    for cycle in range(options.burst_cycles):
        start = cycle * options.burst_period_s
        dues += arrivals_between(start, start + options.burst_on_s, rate, rng, options.arrivals)
    return Schedule(tuple(dues), 0.0, options.burst_cycles * options.burst_period_s)


def schedule_for(load: str, capacity: float, options: Options, rng: random.Random) -> Schedule:
    if load == BURSTY:
        return bursty(options.burst_fraction * capacity, options, rng)
    rate = float(load.removesuffix("%")) / 100 * capacity
    duration_s = max(options.duration_s, options.min_requests / rate)
    return steady(rate, options.warmup_s, duration_s, rng, options.arrivals)


# -- one run -------------------------------------------------------------------------------------------


@dataclass
class Driven(loadgen.RunResult):
    """What the client saw of one scheduled run (latencies_s: answered 200, measured part only),
    and the replica's /metrics sampled meanwhile."""

    measured: int = 0
    last_answer_s: float = 0.0  # of a measured request, from the start
    samples: list[tuple[float, str]] = field(default_factory=list)  # (seconds from start, /metrics)


async def drive(
    server: servers.ServerProcess, request: loadgen.Request, schedule: Schedule, options: Options
) -> Driven:
    """loadgen.open_loop's pool and timing, with arrival times given and /metrics sampled alongside."""
    driven = Driven("open", MAX_CONNECTIONS, None)
    pool = loadgen.ConnectionPool(server.host, server.port, MAX_CONNECTIONS)
    start = time.perf_counter()
    stop = asyncio.Event()

    async def one(due_s: float) -> None:
        measured = due_s >= schedule.measure_from_s
        for attempt in range(2):
            connection = None
            reused = False
            try:
                connection, reused = await pool.take()
                status, body = await connection.call(request)
                break
            except (OSError, asyncio.IncompleteReadError, ValueError) as error:
                if connection is not None:
                    connection.close()
                    await pool.give_back(None)
                # A keep-alive connection the server closed while it sat idle (uvicorn's
                # timeout_keep_alive): once, the request goes again on a new one.
                stale = reused and isinstance(error, asyncio.IncompleteReadError | ConnectionResetError)
                if attempt == 0 and stale:
                    continue
                if measured:
                    driven.record_error(f"{type(error).__name__}: {error}")
                return
        await pool.give_back(connection)
        done = time.perf_counter() - start
        if not measured:
            return
        if status == 200:
            driven.latencies_s.append(done - due_s)
            driven.last_answer_s = max(driven.last_answer_s, done)
        else:
            driven.record_error(f"HTTP {status}: {body[:200]!r}")

    async def sample_metrics() -> None:
        scrape = loadgen.Request.get(server.host, server.port, "/metrics")
        connection = await loadgen.Connection.open(server.host, server.port)
        try:
            while True:
                at = time.perf_counter() - start
                status, body = await connection.call(scrape)
                if status == 200:
                    driven.samples.append((at, body.decode()))
                if stop.is_set():
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), options.sample_s)
        finally:
            connection.close()

    cpu_before = time.process_time()
    sampler = asyncio.ensure_future(sample_metrics())
    tasks = []
    for due_s in schedule.dues:
        delay = start + due_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        driven.measured += due_s >= schedule.measure_from_s
        tasks.append(asyncio.ensure_future(one(due_s)))
    end_s = schedule.measure_from_s + schedule.measured_s
    if tasks:
        _, late = await asyncio.wait(tasks, timeout=options.grace_s)
        for task in late:
            task.cancel()
        for _ in late:
            driven.record_error(f"no answer within {options.grace_s} s after the last arrival")
        await asyncio.gather(*late, return_exceptions=True)
    # The series goes on to the end of the schedule (a bursty run ends idle), then one last sample.
    delay = start + end_s - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    stop.set()
    await sampler
    driven.client_cpu_s = time.process_time() - cpu_before
    pool.close()
    return driven


# -- reading /metrics ------------------------------------------------------------------------------------


def gauge(text: str, name: str) -> float:
    """A gauge's value (NaN when absent: the fixed windows export no adaptive figures they use)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return math.nan


def _delta(after: str, before: str, name: str) -> promtext.Histogram:
    return promtext.parse_histogram(after, name).minus(promtext.parse_histogram(before, name))


def _counter_delta(after: str, before: str, name: str) -> float:
    try:
        return promtext.parse_counter(after, name) - promtext.parse_counter(before, name)
    except LookupError:
        return math.nan


SERIES_KEYS = (
    "t", "offered_rps", "arrival_rate", "planned_batch_size", "mean_batch_size", "batches", "mean_wait_ms",
    "queue_depth",
)  # fmt: skip


def series(driven: Driven, schedule: Schedule) -> dict[str, list[float | None]]:
    """Sample by sample: the offered rate, what the replica measured and chose, what it formed."""
    out: dict[str, list[float | None]] = {key: [] for key in SERIES_KEYS}
    for (t0, before), (t1, after) in zip(driven.samples, driven.samples[1:], strict=False):
        sizes = _delta(after, before, "batchd_batch_size")
        waits = _delta(after, before, "batchd_batch_wait_seconds")
        offered = sum(1 for due in schedule.dues if t0 <= due < t1)
        values: dict[str, float] = {
            "t": round(t1, 3),
            "offered_rps": offered / (t1 - t0),
            "arrival_rate": gauge(after, "batchd_arrival_rate"),
            "planned_batch_size": gauge(after, "batchd_planned_batch_size"),
            "mean_batch_size": sizes.mean,
            "batches": sizes.count,
            "mean_wait_ms": waits.mean * 1000,
            "queue_depth": gauge(after, "batchd_queue_depth"),
        }
        for key, value in values.items():
            out[key].append(None if math.isnan(value) else round(value, 3))
    return out


def summarise_run(driven: Driven, schedule: Schedule, adaptive: bool, keep_series: bool) -> dict[str, Any]:
    measured_s = max(schedule.measured_s, driven.last_answer_s - schedule.measure_from_s)
    lat = driven.latencies_s
    run: dict[str, Any] = {
        "offered": driven.measured,
        "completed": len(lat),
        "errors": driven.errors,
        "error_samples": driven.error_samples,
        "throughput_rps": len(lat) / measured_s,
        **latency_summary(lat),
        "max_ms": max(lat) * 1000 if lat else math.nan,
        "duration_s": measured_s,
        "client_cpu_s": driven.client_cpu_s,
    }
    # Figures over the measured part: from the last sample before it to the last sample of all.
    inside = [(t, text) for t, text in driven.samples if t >= schedule.measure_from_s] or driven.samples
    before = [text for t, text in driven.samples if t <= schedule.measure_from_s]
    first, last = (before[-1] if before else driven.samples[0][1]), driven.samples[-1][1]
    sizes = _delta(last, first, "batchd_batch_size")
    waits = _delta(last, first, "batchd_batch_wait_seconds")
    executions = _delta(last, first, "batchd_batch_execution_seconds")
    run.update(
        batches=sizes.count,
        mean_batch_size=sizes.mean,
        batch_sizes=sizes.distribution(),
        mean_wait_ms=waits.mean * 1000,
        mean_execution_ms=executions.mean * 1000,
    )
    if adaptive:
        planned = [gauge(text, "batchd_planned_batch_size") for _, text in inside]
        rates = [gauge(text, "batchd_arrival_rate") for _, text in inside]
        run.update(
            cost_fixed_ms=gauge(last, "batchd_batch_cost_fixed_seconds") * 1000,
            cost_per_item_ms=gauge(last, "batchd_batch_cost_per_item_seconds") * 1000,
            planned_batch_size_median=median(planned),
            arrival_rate_median=median(rates),
            objective_items=_counter_delta(last, first, "batchd_objective_items"),
            objective_missed=_counter_delta(last, first, "batchd_objective_missed"),
        )
    if keep_series:
        run["series"] = series(driven, schedule)
    return run


def measure_run(
    server: servers.ServerProcess, model: str, subject: str, load: str, schedule: Schedule, options: Options
) -> dict[str, Any]:
    driven = uvloop.run(drive(server, request_for(model, server), schedule, options))
    server.check_alive()
    run = summarise_run(driven, schedule, adaptive=subject == ADAPTIVE, keep_series=load == BURSTY)
    if driven.errors:
        logger.warning(
            "%s %s %s: %d errors, e.g. %s", model, subject, load, driven.errors, driven.error_samples[:1]
        )
    return run


def measure_capacity(server: servers.ServerProcess, model: str, options: Options) -> list[float]:
    """Closed loop at options.capacity_clients against the 0 ms window: full batches back to back."""
    request = request_for(model, server)
    runs = []
    for index in range(options.capacity_runs):
        warmup_s = 1.0 if index == 0 else 0.5
        result = loadgen.run(
            loadgen.closed_loop(
                server.host, server.port, request, options.capacity_clients, options.capacity_s, warmup_s
            )
        )
        if result.errors:
            raise RuntimeError(
                f"capacity run of {model}: {result.errors} errors, e.g. {result.error_samples[:1]}"
            )
        runs.append(result.throughput_rps)
    return runs


# -- one model ------------------------------------------------------------------------------------------


def run_model(model: str, options: Options, workdir: Path) -> dict[str, Any]:
    assets = workdir / "assets"
    logs = workdir / "logs"
    env = {"BATCHD_MODEL_MIRROR": str(minilm_mirror(assets / "mirror"))} if model == "minilm" else {}
    began = time.time()
    fixed = [subject for subject in options.subjects if subject != ADAPTIVE]
    started: dict[str, servers.ServerProcess] = {}
    for subject in fixed:
        path = servers.write_manifest(workdir, subject_manifest(model, subject, options, None))
        started[subject] = servers.start_replica(path, logs, env=env)
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with contextlib.ExitStack() as stack:
        stack.enter_context(servers.running(list(started.values())))
        zero = started[window_subject(0.0)] if window_subject(0.0) in started else started[fixed[0]]
        logger.info(
            "[%s] capacity: closed loop, %d clients, %s window", model, options.capacity_clients, zero.name
        )
        capacity_runs = measure_capacity(zero, model, options)
        capacity = max(capacity_runs)  # a neighbour's burst of CPU can only lower a run
        full_batch_s = options.max_batch_size / capacity
        objective_s = round(options.objective_factor * full_batch_s, 3)
        logger.info(
            "[%s] capacity %.0f items/s; adaptive objective %.0f ms", model, capacity, objective_s * 1000
        )
        path = servers.write_manifest(workdir, subject_manifest(model, ADAPTIVE, options, objective_s))
        started[ADAPTIVE] = servers.start_replica(path, logs, env=env)
        stack.enter_context(servers.running([started[ADAPTIVE]]))
        subjects = list(options.subjects)
        for repeat in range(options.repeats):
            order = subjects[repeat % len(subjects) :] + subjects[: repeat % len(subjects)]
            for load in options.loads:
                # The same arrival times for every subject of this repeat and load.
                schedule = schedule_for(
                    load, capacity, options, random.Random(f"{options.seed}-{model}-{load}-{repeat}")
                )
                for subject in order:
                    logger.info(
                        "[%s] repeat %d/%d: %s, %s (%d requests)",
                        model, repeat + 1, options.repeats, subject, load, len(schedule.dues),
                    )  # fmt: skip
                    run = measure_run(started[subject], model, subject, load, schedule, options)
                    runs.setdefault((subject, load), []).append(run)
                    time.sleep(options.pause_s)
    exit_codes = {subject: server.process.returncode for subject, server in started.items()}
    result: dict[str, Any] = {
        "model": model,
        "title": TITLES[model],
        "started": began,
        "capacity_rps": capacity,
        "capacity_runs_rps": capacity_runs,
        "objective_s": objective_s,
        "exit_codes": exit_codes,
        "runs": {subject: {load: runs[(subject, load)] for load in options.loads} for subject in subjects},
    }
    if is_cost_curve(model):
        full = options.alpha_s + options.beta_s * options.max_batch_size
        result["curve_capacity_rps"] = options.max_batch_size / full
    result["summary"] = summarise(result)
    result["verdicts"] = verdicts(result["summary"], options)
    result["adaptivity"] = adaptivity(result, options)
    return result


MEDIAN_FIGURES = (
    "p50_ms", "p99_ms", "throughput_rps", "mean_batch_size", "mean_wait_ms", "errors", "offered",
    "cost_fixed_ms", "cost_per_item_ms", "planned_batch_size_median", "arrival_rate_median",
)  # fmt: skip


def summarise(result: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per subject and load, the median of each figure over the repeats (and the repeats' p99s)."""
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for subject, by_load in result["runs"].items():
        summary[subject] = {}
        for load, runs in by_load.items():
            figures: dict[str, Any] = {
                key: median([run[key] for run in runs if run.get(key) is not None])
                for key in MEDIAN_FIGURES
                if any(key in run for run in runs)
            }
            figures["p99_ms_runs"] = [run["p99_ms"] for run in runs]
            figures["errors_total"] = sum(run["errors"] for run in runs)
            items = sum(run.get("objective_items", 0) for run in runs)
            if items:
                figures["objective_missed_share"] = sum(run["objective_missed"] for run in runs) / items
            summary[subject][load] = figures
    return summary


def verdicts(summary: dict[str, dict[str, dict[str, Any]]], options: Options) -> dict[str, Any]:
    """The goals of issue 12, per load and on the mix (see the module docstring)."""
    fixed = [s for s in options.subjects if s != ADAPTIVE]
    per_load: dict[str, dict[str, Any]] = {}
    for load in options.loads:
        p99 = {s: summary[s][load]["p99_ms"] for s in options.subjects}
        tput = {s: summary[s][load]["throughput_rps"] for s in options.subjects}
        best_p99_subject = min(fixed, key=lambda s: p99[s])
        best_tput_subject = max(fixed, key=lambda s: tput[s])
        p99_ratio = p99[ADAPTIVE] / p99[best_p99_subject]
        tput_ratio = tput[ADAPTIVE] / tput[best_tput_subject]
        per_load[load] = {
            "best_fixed_p99": best_p99_subject,
            "best_fixed_p99_ms": p99[best_p99_subject],
            "adaptive_p99_ms": p99[ADAPTIVE],
            "p99_ratio": p99_ratio,
            "p99_met": p99_ratio <= 1.10,
            "best_fixed_throughput": best_tput_subject,
            "best_fixed_throughput_rps": tput[best_tput_subject],
            "adaptive_throughput_rps": tput[ADAPTIVE],
            "throughput_ratio": tput_ratio,
            "throughput_met": tput_ratio >= 0.95,
        }
    best = {load: min(summary[s][load]["p99_ms"] for s in options.subjects) for load in options.loads}
    mix = {
        s: sum(summary[s][load]["p99_ms"] / best[load] for load in options.loads) / len(options.loads)
        for s in options.subjects
    }
    p99_sum = {s: sum(summary[s][load]["p99_ms"] for load in options.loads) for s in options.subjects}
    goals = {
        "p99 within 10% of the best fixed window's, at every load": all(
            v["p99_met"] for v in per_load.values()
        ),
        "throughput within 5% of the best fixed window's, at every load": all(
            v["throughput_met"] for v in per_load.values()
        ),
        "beats every fixed window on the mix (mean of p99 / best p99 over the loads)": all(
            mix[ADAPTIVE] < mix[s] for s in fixed
        ),
    }
    return {"per_load": per_load, "mix_score": mix, "p99_sum_ms": p99_sum, "goals": goals}


def adaptivity(result: dict[str, Any], options: Options) -> dict[str, Any]:
    """How fast the adaptive replica followed the bursty load's steps (from its /metrics series):
    per burst, the seconds from its start until the arrival-rate estimate reached 63% of the
    offered rate and until the batches formed reached 90% of that burst's largest interval mean,
    and after it, until no batch ran any more (the backlog served)."""
    rate_lags, batch_lags, drains = [], [], []
    on_rate = options.burst_fraction * result["capacity_rps"]
    for run in result["runs"][ADAPTIVE][BURSTY]:
        s = run["series"]
        for cycle in range(options.burst_cycles):
            on = cycle * options.burst_period_s
            off = on + options.burst_on_s
            end = on + options.burst_period_s
            points = [i for i, t in enumerate(s["t"]) if on < t <= end]
            burst = [i for i in points if s["t"][i] <= off]
            if not burst:
                continue
            rate_at = [s["t"][i] - on for i in burst if (s["arrival_rate"][i] or 0) >= 0.63 * on_rate]
            sizes = [s["mean_batch_size"][i] or 0 for i in burst]
            top = max(sizes)
            size_at = [s["t"][i] - on for i in burst if (s["mean_batch_size"][i] or 0) >= 0.9 * top]
            busy_after = [s["t"][i] - off for i in points if s["t"][i] > off and (s["batches"][i] or 0) > 0]
            if rate_at:
                rate_lags.append(rate_at[0])
            if size_at:
                batch_lags.append(size_at[0])
            drains.append(max(busy_after, default=0.0))
    return {
        "rate_estimate_63pct_s": median(rate_lags),
        "batch_size_90pct_s": median(batch_lags),
        "backlog_served_after_burst_s": median(drains),
        "bursts": len(drains),
    }


# -- reports -------------------------------------------------------------------------------------------


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def model_markdown(result: dict[str, Any]) -> str:
    options = options_of(result)
    meta = result["meta"]
    summary, verdict = result["summary"], result["verdicts"]
    subjects = options.subjects
    model = result["model"]
    capacity = result["capacity_rps"]
    if is_cost_curve(model):
        what = (
            f"`CostCurve` ({options.alpha_s * 1000:g} ms + {options.beta_s * 1000:g} ms per item, "
            f"max_batch_size {options.max_batch_size}, max_concurrent_batches {SLOTS.get(model, 1)}"
            f"{' sharing one device' if model == SHARED_DEVICE else ''}): "
            f"capacity measured {capacity:.0f} items/s "
            f"(the curve says {result['curve_capacity_rps']:.0f})"
        )
    else:
        what = f"MiniLM-L6, CPU, max_batch_size {options.max_batch_size}: capacity measured {capacity:.0f} "
        what += "items/s"
    lines = [
        f"## {result['title']}",
        "",
        f"`{meta['command']}` ({meta['date']}, {meta['machine']}; {meta['minutes']:g} min; load average "
        f"{meta['load_average_before']:.1f} before, {meta['load_average_after']:.1f} after: the machine is "
        "shared).",
        "",
        f"{what} (closed loop, {options.capacity_clients} clients, 0 ms window; runs: "
        + ", ".join(f"{v:.0f}" for v in result["capacity_runs_rps"])
        + f"). Adaptive objective: {result['objective_s'] * 1000:.0f} ms "
        f"({options.objective_factor:g} x a full batch at capacity).",
        "",
        "p99 latency (ms) / throughput (req/s), medians of "
        f"{options.repeats} repeat(s); the best fixed window's p99 at each load in bold.",
        "",
        "| load | offered req/s | " + " | ".join(subjects) + " | adaptive vs best fixed: p99, throughput |",
        "|---|---:|" + "---:|" * len(subjects) + "---|",
    ]
    for load in options.loads:
        v = verdict["per_load"][load]
        offered = (
            f"{options.burst_fraction * capacity:.0f} on / 0 off"
            if load == BURSTY
            else f"{float(load.removesuffix('%')) / 100 * capacity:.0f}"
        )
        cells = []
        for subject in subjects:
            figures = summary[subject][load]
            p99 = _ms(figures["p99_ms"])
            if subject == v["best_fixed_p99"]:
                p99 = f"**{p99}**"
            cells.append(f"{p99} / {figures['throughput_rps']:.0f}")
        lines.append(
            f"| {load} | {offered} | "
            + " | ".join(cells)
            + f" | {v['p99_ratio']:.2f} ({'met' if v['p99_met'] else 'NOT met'}), "
            f"{v['throughput_ratio']:.3f} ({'met' if v['throughput_met'] else 'NOT met'}) |"
        )
    mix = verdict["mix_score"]
    lines += [
        "",
        "On the mix (mean over the five loads of p99 / the best p99 at that load; 1.00 = best everywhere): "
        + ", ".join(f"{s} **{mix[s]:.2f}**" if s == ADAPTIVE else f"{s} {mix[s]:.2f}" for s in subjects)
        + ". Sum of the p99s: "
        + ", ".join(f"{s} {verdict['p99_sum_ms'][s]:.0f} ms" for s in subjects)
        + ".",
        "",
        *(f"- {'met' if ok else '**NOT met**'}: {goal}" for goal, ok in verdict["goals"].items()),
        "",
        "What the replicas did (medians): mean batch size formed, and for the adaptive replica the "
        "batch size it planned (median of the samples), its mean wait, and the share of items over "
        "the objective.",
        "",
        "| load | " + " | ".join(f"{s} batch" for s in subjects) + " | adaptive planned | adaptive wait ms "
        "| 0 ms wait ms | over objective |",
        "|---|" + "---:|" * (len(subjects) + 4),
    ]
    zero = window_subject(0.0)
    for load in options.loads:
        a = summary[ADAPTIVE][load]
        missed = a.get("objective_missed_share")
        zero_wait = _ms(summary[zero][load]["mean_wait_ms"]) if zero in summary else "-"
        lines.append(
            f"| {load} | "
            + " | ".join(f"{summary[s][load]['mean_batch_size']:.1f}" for s in subjects)
            + f" | {a.get('planned_batch_size_median', math.nan):.0f} | {_ms(a['mean_wait_ms'])} "
            + f"| {zero_wait} | "
            + ("-" if missed is None else f"{missed:.1%}")
            + " |"
        )
    fits = [
        (
            summary[ADAPTIVE][load].get("cost_fixed_ms", math.nan),
            summary[ADAPTIVE][load].get("cost_per_item_ms", math.nan),
        )
        for load in options.loads
    ]
    truth = (
        f" (the truth: {options.alpha_s * 1000:g} + {options.beta_s * 1000:g} ms per item)"
        if is_cost_curve(model)
        else ""
    )
    lines += [
        "",
        "Learned cost line at the end of each load (fixed ms + ms per item): "
        + ", ".join(f"{load} {a:.1f} + {b:.2f}" for load, (a, b) in zip(options.loads, fits, strict=True))
        + truth
        + ".",
    ]
    adapt = result["adaptivity"]
    lines += [
        "",
        f"Adapting (bursty runs, /metrics every {options.sample_s:g} s, median over "
        f"{adapt['bursts']} bursts): the adaptive replica's arrival-rate estimate reached 63% of the "
        f"burst's rate {adapt['rate_estimate_63pct_s']:.1f} s after each burst began, the batches it "
        f"formed reached 90% of the burst's largest within {adapt['batch_size_90pct_s']:.1f} s, "
        f"and its last batch of the burst's backlog ran {adapt['backlog_served_after_burst_s']:.1f} s "
        "after the burst ended "
        "(time series: `runs.adaptive.bursty[*].series` in adaptive.json).",
    ]
    return "\n".join(lines) + "\n"


def to_markdown(report: dict[str, Any]) -> str:
    options = options_of(next(iter(report["models"].values())))
    parts = [
        "# Adaptive batching benchmark (issue 12)",
        "",
        "Five replicas per model (one batch at a time, but for the two slots of "
        f"`{SHARED_DEVICE}`), max_batch_size {options.max_batch_size}: fixed windows "
        + ", ".join(window_subject(ms) for ms in options.windows_ms)
        + " and adaptive (`latency_objective_s`). Open loops, "
        f"{options.arrivals} arrivals (the same arrival times for every subject of a repeat), at "
        + ", ".join(load_name(f) for f in options.fractions)
        + f" of the measured capacity for {options.duration_s:g} s"
        + (f" or {options.min_requests} requests, whichever is longer," if options.min_requests else "")
        + f" after {options.warmup_s:g} s of warm-up at the same rate; bursty: "
        f"{options.burst_fraction:.0%} of capacity for {options.burst_on_s:g} s, then "
        f"{options.burst_off_s:g} s idle, {options.burst_cycles} times. Latency from when each request "
        "was due. Subjects take turns within each repeat, in a rotating order. "
        "See `batchd/bench/adaptive.py` for the definitions.",
        "",
    ]
    for result in report["models"].values():
        parts.append(model_markdown(result))
    parts.append("![p99 against arrival rate](adaptive.png)\n")
    return "\n".join(parts)


# -- the chart ---------------------------------------------------------------------------------------

STYLES: dict[str, tuple[str, str]] = {
    "0 ms": ("tab:blue", "o"),
    "2 ms": ("tab:green", "s"),
    "10 ms": ("tab:purple", "^"),
    "50 ms": ("tab:orange", "v"),
    ADAPTIVE: ("black", "D"),
}


def label(subject: str, result: dict[str, Any]) -> str:
    if subject == ADAPTIVE:
        return f"adaptive ({result['objective_s'] * 1000:.0f} ms objective)"
    return subject


def draw_chart(report: dict[str, Any], path: Path) -> None:
    """p99 against arrival rate (fraction of capacity), one panel per model; the bursty load apart."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, ScalarFormatter

    results = list(report["models"].values())
    figure, axes = plt.subplots(1, len(results), figsize=(6.4 * len(results), 5.6), squeeze=False)
    options = options_of(results[0])
    burst_x = options.burst_fraction
    spread = 0.018  # the bursty markers side by side, not on top of each other
    for ax, result in zip(axes[0], results, strict=True):
        summary = result["summary"]
        options = options_of(result)
        values: list[float] = []
        for index, subject in enumerate(options.subjects):
            color, marker = STYLES.get(subject, ("tab:gray", "x"))
            bold = subject == ADAPTIVE
            p99 = [summary[subject][load_name(f)]["p99_ms"] for f in options.fractions]
            burst_p99 = summary[subject][BURSTY]["p99_ms"]
            values += [*p99, burst_p99]
            ax.plot(
                options.fractions, p99, marker=marker, color=color, lw=2.4 if bold else 1.3,
                ms=7 if bold else 5, label=label(subject, result), zorder=3 if bold else 2,
            )  # fmt: skip
            offset = (index - (len(options.subjects) - 1) / 2) * spread
            ax.plot(
                [burst_x + offset], [burst_p99], marker=marker, color=color,
                ms=8 if bold else 6, ls="none", mfc="none" if not bold else color, mew=1.6,
            )  # fmt: skip
        ax.axvline((max(options.fractions) + burst_x) / 2, color="grey", lw=0.8, ls=":")
        objective_ms = result["objective_s"] * 1000
        ax.axhline(objective_ms, color="black", lw=0.8, ls="--", alpha=0.5)
        ax.annotate(
            "adaptive's objective", (options.fractions[0], objective_ms * 1.03), fontsize=8, color="dimgray"
        )
        ax.set_yscale("log")
        finite = [v for v in values if not math.isnan(v)] or [1.0]
        low, high = min(finite) / 1.25, max(max(finite), objective_ms) * 1.25
        ax.set_ylim(low, high)
        ticks = [t * 10**e for e in range(0, 5) for t in (1, 2, 3, 5) if low <= t * 10**e <= high]
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(0, burst_x + 0.1)
        ax.set_xticks([*options.fractions, burst_x])
        ax.set_xticklabels([f"{f:.0%}" for f in options.fractions] + [f"bursty\n(on/off at {burst_x:.0%})"])
        ax.set_xlabel(
            f"open-loop arrival rate, of the measured capacity ({result['capacity_rps']:.0f} req/s)"
        )
        ax.set_ylabel("p99 latency, ms (log scale)")
        ax.set_title(result["title"], fontsize=11)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title="batch window", title_fontsize=8, loc="upper left")
    figure.suptitle(
        "p99 latency against arrival rate: fixed batch windows vs adaptive batching\n"
        f"(one replica each, max_batch_size {options.max_batch_size}; medians of {options.repeats} "
        "interleaved repeat(s))",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# -- the command ---------------------------------------------------------------------------------------


def options_of(result: dict[str, Any]) -> Options:
    """The options a model's results were made with (as adaptive.json holds them)."""
    values: dict[str, Any] = {
        key: tuple(value) if isinstance(value, list) else value
        for key, value in result["options"].items()
        if key in Options.__dataclass_fields__
    }
    return Options(**values)


def write_reports(report: dict[str, Any], output: Path) -> None:
    """adaptive.md and adaptive.png from a report as adaptive.json holds it (null for a missing figure)."""
    report = records.none_to_nan(report)
    text = to_markdown(report)
    (output / "adaptive.md").write_text(text)
    draw_chart(report, output / "adaptive.png")
    print(text)
    print(f"results: {output / 'adaptive.json'}, .md and .png")


def render(path: Path, output: Path) -> int:
    output.mkdir(parents=True, exist_ok=True)
    write_reports(json.loads(path.read_text()), output)
    return 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m batchd.bench.adaptive", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="smoke-sized: cost-curve handler, one repeat")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=None)
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3)")
    parser.add_argument("--duration-s", type=float, default=None, help="measured seconds per open loop (10)")
    parser.add_argument("--arrivals", choices=("poisson", "uniform"), default=None)
    parser.add_argument(
        "--fractions",
        type=float,
        nargs="+",
        default=None,
        help="open-loop rates, of capacity (0.1 0.5 0.8 0.95)",
    )
    parser.add_argument("--windows-ms", type=float, nargs="+", default=None, help="fixed windows (0 2 10 50)")
    parser.add_argument("--burst-cycles", type=int, default=None, help="on/off cycles of the bursty load (4)")
    parser.add_argument("--output-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--workdir", type=Path, default=None, help="keep the manifests and replica logs here")
    parser.add_argument(
        "--render", type=Path, default=None, metavar="JSON", help="only rewrite the .md and .png from a .json"
    )
    args = parser.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats: expected 1 or more, got {args.repeats}")
    if args.fractions is not None and not all(0 < f <= 2 for f in args.fractions):
        parser.error(f"--fractions: expected shares of capacity above 0 and at most 2, got {args.fractions}")
    if args.windows_ms is not None and any(ms < 0 for ms in args.windows_ms):
        parser.error(f"--windows-ms: expected 0 or more, got {args.windows_ms}")
    if args.burst_cycles is not None and args.burst_cycles < 1:
        parser.error(f"--burst-cycles: expected 1 or more, got {args.burst_cycles}")
    return args


def options_from(args: argparse.Namespace) -> Options:
    options = QUICK if args.quick else Options()
    if args.models:
        options = replace(options, models=tuple(args.models))
    if args.repeats is not None:
        options = replace(options, repeats=args.repeats)
    if args.duration_s is not None:
        options = replace(options, duration_s=args.duration_s)
    if args.arrivals is not None:
        options = replace(options, arrivals=args.arrivals)
    if args.fractions is not None:
        options = replace(options, fractions=tuple(args.fractions))
    if args.windows_ms is not None:
        options = replace(options, windows_ms=tuple(args.windows_ms))
    if args.burst_cycles is not None:
        options = replace(options, burst_cycles=args.burst_cycles)
    return options


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    options = options_from(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.render is not None:
        return render(args.render, args.output_dir)
    # SIGTERM unwinds like Ctrl-C, so that the replicas are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    output = args.output_dir
    output.mkdir(parents=True, exist_ok=True)
    path = output / "adaptive.json"
    report: dict[str, Any] = {"models": {}}
    if path.exists():  # other models' results, from an earlier run, stay
        with contextlib.suppress(ValueError, KeyError):
            report["models"] = {
                m: r for m, r in json.loads(path.read_text())["models"].items() if "meta" in r
            }
    errors: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="batchd-adaptive-") as temporary:
        workdir = args.workdir or Path(temporary)
        for model in options.models:
            meta = {
                **records.run_meta("batchd.bench.adaptive", argv),
                "load_average_before": os.getloadavg()[0],
            }
            result = run_model(model, options, workdir)
            meta["load_average_after"] = os.getloadavg()[0]
            meta["minutes"] = round((time.time() - result.pop("started")) / 60, 1)
            report["models"][model] = {
                "meta": meta,
                "options": {
                    **asdict(options),
                    "subjects": list(options.subjects),
                    "loads": list(options.loads),
                },
                **result,
            }
            ordered = {m: report["models"][m] for m in (*MODELS, *report["models"]) if m in report["models"]}
            report["models"] = ordered
            records.write_json(path, report)
            errors[model] = sum(
                f["errors_total"] for by_load in result["summary"].values() for f in by_load.values()
            )
    write_reports(json.loads(path.read_text()), output)
    if any(errors.values()):
        print(f"FAILED: requests without a 200: {errors}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
