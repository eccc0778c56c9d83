"""Turning runs into figures (what adaptive.json holds, as frozen dataclasses): per run, medians
over repeats, the goals' verdicts and how fast the adaptive replica followed the bursts."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from batchd.bench.adaptive.workload import ADAPTIVE, Options, Schedule
from batchd.bench.kit import loadgen
from batchd.bench.kit.goals import Goal
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.stats import LatencySummary, median, ratio
from batchd.testing.promtext import counter_delta, gauge, histogram_delta, parse_histogram

NAN = math.nan


@dataclass(frozen=True)
class RunFigures:
    """One subject under one load, one repeat: the client's figures over the measured part, the
    batches the replica formed (from its /metrics), and for the adaptive replica what it learned
    and chose (NaN for a fixed window)."""

    offered: int
    completed: int
    errors: int
    error_samples: list[str]
    throughput_rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    duration_s: float
    client_cpu_s: float
    batches: float
    mean_batch_size: float
    batch_sizes: dict[str, int]
    mean_wait_ms: float
    mean_execution_ms: float = NAN
    cost_fixed_ms: float = NAN
    cost_per_item_ms: float = NAN
    planned_batch_size_median: float = NAN
    arrival_rate_median: float = NAN
    objective_items: float = NAN
    objective_missed: float = NAN
    series: dict[str, list[float | None]] | None = None  # sample by sample (the bursty load only)


@dataclass(frozen=True)
class Figures:
    """One subject under one load: medians over the repeats (NaN where nothing was measured), and
    for the adaptive replica what it planned and learned."""

    p99_ms: float = NAN
    p99_ms_runs: list[float] = field(default_factory=list)  # each repeat's
    throughput_rps: float = NAN
    errors_total: int = 0  # requests without a 200, over every repeat
    mean_batch_size: float = NAN
    mean_wait_ms: float = NAN
    planned_batch_size_median: float = NAN
    objective_missed_share: float = NAN  # of the items the adaptive replica served
    cost_fixed_ms: float = NAN
    cost_per_item_ms: float = NAN


@dataclass(frozen=True)
class LoadVerdict:
    """At one load: the adaptive replica against the best fixed window, for p99 and throughput."""

    best_fixed_p99: str
    best_fixed_p99_ms: float
    adaptive_p99_ms: float
    p99_ratio: float
    p99_met: bool
    best_fixed_throughput: str
    best_fixed_throughput_rps: float
    adaptive_throughput_rps: float
    throughput_ratio: float
    throughput_met: bool


@dataclass(frozen=True)
class Verdicts:
    per_load: dict[str, LoadVerdict]
    mix_score: dict[str, float]  # by subject: mean over the loads of p99 / the best p99 there
    p99_sum_ms: dict[str, float]
    goals: list[Goal]


@dataclass(frozen=True)
class Adaptivity:
    """How fast the adaptive replica followed the bursts: medians over them, in seconds."""

    rate_estimate_63pct_s: float
    batch_size_90pct_s: float
    backlog_served_after_burst_s: float
    bursts: int


@dataclass(frozen=True)
class ModelRecord(RunRecord):
    """Where and when one model ran, and how busy the shared machine was."""

    load_average_before: float
    load_average_after: float
    minutes: float


@dataclass(frozen=True)
class ModelResult:
    meta: ModelRecord
    options: Options
    model: str
    title: str
    capacity_rps: float
    capacity_runs_rps: list[float]
    objective_s: float
    exit_codes: dict[str, int | None]
    runs: dict[str, dict[str, list[RunFigures]]]  # by subject, then load: one per repeat
    summary: dict[str, dict[str, Figures]]  # by subject, then load
    verdicts: Verdicts
    adaptivity: Adaptivity
    curve_capacity_rps: float = NAN  # what the cost curve allows (the cost-curve models)


@dataclass(frozen=True)
class Report:
    """adaptive.json: every model measured so far, the latest run of each."""

    models: dict[str, ModelResult]


@dataclass(frozen=True)
class Driven:
    """One scheduled run: what the client saw (latencies of the measured part, answered 200), and
    the replica's /metrics polled meanwhile, as (seconds from the start, text)."""

    run: loadgen.RunResult
    samples: list[tuple[float, str]]


# The metric families the figures below read (add one here when a figure reads it). Each scrape
# is trimmed to them once, before any figure parses it: every figure parses its text afresh, and
# the request-duration histograms, read by none, are most of /metrics.
READ_FAMILIES = (
    "batchd_batch_size", "batchd_batch_wait_seconds", "batchd_batch_execution_seconds", "batchd_queue_depth",
    "batchd_batch_cost_fixed_seconds", "batchd_batch_cost_per_item_seconds", "batchd_arrival_rate",
    "batchd_planned_batch_size", "batchd_objective_items", "batchd_objective_missed",
)  # fmt: skip


def trimmed(text: str) -> str:
    """The lines of a scrape that belong to READ_FAMILIES: their samples, and their HELP and TYPE."""

    def metric(line: str) -> str:
        if line.startswith("#"):
            words = line.split(" ", 3)
            return words[2] if len(words) > 2 else ""
        return line.split("{", 1)[0].split(" ", 1)[0]

    return "".join(line for line in text.splitlines(keepends=True) if metric(line).startswith(READ_FAMILIES))


SERIES_KEYS = (
    "t", "offered_rps", "arrival_rate", "planned_batch_size", "mean_batch_size", "batches", "mean_wait_ms",
    "queue_depth",
)  # fmt: skip


def series(driven: Driven, schedule: Schedule) -> dict[str, list[float | None]]:
    """Sample by sample: the offered rate, what the replica measured and chose, what it formed."""
    out: dict[str, list[float | None]] = {key: [] for key in SERIES_KEYS}
    # Each scrape's histograms parsed once (not once more as the next interval's start).
    all_sizes = [parse_histogram(text, "batchd_batch_size") for _, text in driven.samples]
    all_waits = [parse_histogram(text, "batchd_batch_wait_seconds") for _, text in driven.samples]
    for i, ((t0, _), (t1, after)) in enumerate(itertools.pairwise(driven.samples)):
        sizes = all_sizes[i + 1].minus(all_sizes[i])
        waits = all_waits[i + 1].minus(all_waits[i])
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


def summarise_run(driven: Driven, schedule: Schedule, adaptive: bool, keep_series: bool) -> RunFigures:
    client = driven.run
    driven = Driven(client, [(t, trimmed(text)) for t, text in driven.samples])
    latency = LatencySummary.of(client.latencies_s)
    # Figures over the measured part: from the last sample before it to the last sample of all.
    inside = [(t, text) for t, text in driven.samples if t >= schedule.measure_from_s] or driven.samples
    before = [text for t, text in driven.samples if t <= schedule.measure_from_s]
    first, last = (before[-1] if before else driven.samples[0][1]), driven.samples[-1][1]
    sizes = histogram_delta(last, first, "batchd_batch_size")
    waits = histogram_delta(last, first, "batchd_batch_wait_seconds")
    executions = histogram_delta(last, first, "batchd_batch_execution_seconds")
    chosen: dict[str, float] = {}
    if adaptive:
        chosen = {
            "cost_fixed_ms": gauge(last, "batchd_batch_cost_fixed_seconds") * 1000,
            "cost_per_item_ms": gauge(last, "batchd_batch_cost_per_item_seconds") * 1000,
            "planned_batch_size_median": median(
                [gauge(text, "batchd_planned_batch_size") for _, text in inside]
            ),
            "arrival_rate_median": median([gauge(text, "batchd_arrival_rate") for _, text in inside]),
            "objective_items": counter_delta(last, first, "batchd_objective_items"),
            "objective_missed": counter_delta(last, first, "batchd_objective_missed"),
        }
    return RunFigures(
        offered=client.offered,
        completed=client.completed,
        errors=client.errors,
        error_samples=client.error_samples,
        throughput_rps=client.throughput_rps,
        p50_ms=latency.p50_ms,
        p95_ms=latency.p95_ms,
        p99_ms=latency.p99_ms,
        mean_ms=latency.mean_ms,
        max_ms=latency.max_ms,
        duration_s=client.duration_s,
        client_cpu_s=client.client_cpu_s,
        batches=sizes.count,
        mean_batch_size=sizes.mean,
        batch_sizes=sizes.distribution(),
        mean_wait_ms=waits.mean * 1000,
        mean_execution_ms=executions.mean * 1000,
        series=series(driven, schedule) if keep_series else None,
        **chosen,
    )


# Figures whose median over the repeats the summary keeps.
MEDIAN_FIGURES = ("p99_ms", "throughput_rps", "mean_batch_size", "mean_wait_ms")
# ... and those only the adaptive replica has (NaN for the fixed windows).
ADAPTIVE_FIGURES = ("planned_batch_size_median", "cost_fixed_ms", "cost_per_item_ms")


def summarise(runs: dict[str, dict[str, list[RunFigures]]]) -> dict[str, dict[str, Figures]]:
    """Per subject and load, the median of each figure over the repeats (and the repeats' p99s)."""
    summary: dict[str, dict[str, Figures]] = {}
    for subject, by_load in runs.items():
        summary[subject] = {}
        for load, repeats in by_load.items():
            items = sum(run.objective_items for run in repeats if not math.isnan(run.objective_items))
            missed = sum(run.objective_missed for run in repeats if not math.isnan(run.objective_missed))
            summary[subject][load] = Figures(
                **{
                    key: median([float(getattr(run, key)) for run in repeats])
                    for key in (*MEDIAN_FIGURES, *ADAPTIVE_FIGURES)
                },
                p99_ms_runs=[run.p99_ms for run in repeats],
                errors_total=sum(run.errors for run in repeats),
                objective_missed_share=missed / items if items else math.nan,
            )
    return summary


def verdicts(summary: dict[str, dict[str, Figures]], options: Options) -> Verdicts:
    """The goals, per load and on the mix (see the package docstring)."""
    fixed = [s for s in options.subjects if s != ADAPTIVE]
    per_load: dict[str, LoadVerdict] = {}
    for load in options.loads:
        p99 = {s: summary[s][load].p99_ms for s in options.subjects}
        tput = {s: summary[s][load].throughput_rps for s in options.subjects}
        best_p99_subject = min(fixed, key=lambda s: p99[s])
        best_tput_subject = max(fixed, key=lambda s: tput[s])
        p99_ratio = p99[ADAPTIVE] / p99[best_p99_subject]
        tput_ratio = tput[ADAPTIVE] / tput[best_tput_subject]
        per_load[load] = LoadVerdict(
            best_fixed_p99=best_p99_subject,
            best_fixed_p99_ms=p99[best_p99_subject],
            adaptive_p99_ms=p99[ADAPTIVE],
            p99_ratio=p99_ratio,
            p99_met=p99_ratio <= 1.10,
            best_fixed_throughput=best_tput_subject,
            best_fixed_throughput_rps=tput[best_tput_subject],
            adaptive_throughput_rps=tput[ADAPTIVE],
            throughput_ratio=tput_ratio,
            throughput_met=tput_ratio >= 0.95,
        )
    best = {load: min(summary[s][load].p99_ms for s in options.subjects) for load in options.loads}
    mix = {
        s: sum(summary[s][load].p99_ms / best[load] for load in options.loads) / len(options.loads)
        for s in options.subjects
    }
    p99_sum = {s: sum(summary[s][load].p99_ms for load in options.loads) for s in options.subjects}
    worst_p99 = max((v.p99_ratio for v in per_load.values()), default=math.nan)
    worst_throughput = min((v.throughput_ratio for v in per_load.values()), default=math.nan)
    best_fixed_mix = min((mix[s] for s in fixed), default=math.nan)
    goals = [
        Goal(
            "p99 within 10% of the best fixed window's, at every load",
            worst_p99,
            1.10,
            all(v.p99_met for v in per_load.values()),
        ),
        Goal(
            "throughput within 5% of the best fixed window's, at every load",
            worst_throughput,
            0.95,
            all(v.throughput_met for v in per_load.values()),
        ),
        Goal(
            "beats every fixed window on the mix (mean of p99 / best p99 over the loads)",
            ratio(mix[ADAPTIVE], best_fixed_mix),
            1.0,
            all(mix[ADAPTIVE] < mix[s] for s in fixed),
        ),
    ]
    return Verdicts(per_load, mix, p99_sum, goals)


def adaptivity(bursty_runs: list[RunFigures], capacity_rps: float, options: Options) -> Adaptivity:
    """How fast the adaptive replica followed the bursty load's steps (from its /metrics series):
    per burst, the seconds from its start until the arrival-rate estimate reached 63% of the
    offered rate and until the batches formed reached 90% of that burst's largest interval mean,
    and after it, until no batch ran any more (the backlog served)."""
    rate_lags, batch_lags, drains = [], [], []
    on_rate = options.burst_fraction * capacity_rps
    for run in bursty_runs:
        s = run.series or {}
        times = [t or 0.0 for t in s.get("t", [])]
        for cycle in range(options.burst_cycles):
            on = cycle * options.burst_period_s
            off = on + options.burst_on_s
            end = on + options.burst_period_s
            points = [i for i, t in enumerate(times) if on < t <= end]
            burst = [i for i in points if times[i] <= off]
            if not burst:
                continue
            rate_at = [times[i] - on for i in burst if (s["arrival_rate"][i] or 0) >= 0.63 * on_rate]
            top = max(s["mean_batch_size"][i] or 0 for i in burst)
            size_at = [times[i] - on for i in burst if (s["mean_batch_size"][i] or 0) >= 0.9 * top]
            busy_after = [times[i] - off for i in points if times[i] > off and (s["batches"][i] or 0) > 0]
            if rate_at:
                rate_lags.append(rate_at[0])
            if size_at:
                batch_lags.append(size_at[0])
            drains.append(max(busy_after, default=0.0))
    return Adaptivity(median(rate_lags), median(batch_lags), median(drains), len(drains))
