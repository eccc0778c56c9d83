"""Turning runs into figures: per run, medians over repeats, the goals' verdicts and how fast the
adaptive replica followed the bursts."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from batchd.bench.adaptive.options import ADAPTIVE, BURSTY, Options
from batchd.bench.adaptive.schedules import Schedule
from batchd.bench.kit import loadgen
from batchd.bench.kit.promtext import counter_delta, gauge, histogram_delta
from batchd.bench.kit.stats import LatencySummary, median


@dataclass(frozen=True)
class Driven:
    """One scheduled run: what the client saw (latencies of the measured part, answered 200), and
    the replica's /metrics polled meanwhile, as (seconds from the start, text)."""

    run: loadgen.RunResult
    samples: list[tuple[float, str]]


SERIES_KEYS = (
    "t", "offered_rps", "arrival_rate", "planned_batch_size", "mean_batch_size", "batches", "mean_wait_ms",
    "queue_depth",
)  # fmt: skip


def series(driven: Driven, schedule: Schedule) -> dict[str, list[float | None]]:
    """Sample by sample: the offered rate, what the replica measured and chose, what it formed."""
    out: dict[str, list[float | None]] = {key: [] for key in SERIES_KEYS}
    for (t0, before), (t1, after) in zip(driven.samples, driven.samples[1:], strict=False):
        sizes = histogram_delta(after, before, "batchd_batch_size")
        waits = histogram_delta(after, before, "batchd_batch_wait_seconds")
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
    client = driven.run
    run: dict[str, Any] = {
        "offered": client.offered,
        "completed": client.completed,
        "errors": client.errors,
        "error_samples": client.error_samples,
        "throughput_rps": client.throughput_rps,
        **asdict(LatencySummary.of(client.latencies_s)),
        "duration_s": client.duration_s,
        "client_cpu_s": client.client_cpu_s,
    }
    # Figures over the measured part: from the last sample before it to the last sample of all.
    inside = [(t, text) for t, text in driven.samples if t >= schedule.measure_from_s] or driven.samples
    before = [text for t, text in driven.samples if t <= schedule.measure_from_s]
    first, last = (before[-1] if before else driven.samples[0][1]), driven.samples[-1][1]
    sizes = histogram_delta(last, first, "batchd_batch_size")
    waits = histogram_delta(last, first, "batchd_batch_wait_seconds")
    executions = histogram_delta(last, first, "batchd_batch_execution_seconds")
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
            objective_items=counter_delta(last, first, "batchd_objective_items"),
            objective_missed=counter_delta(last, first, "batchd_objective_missed"),
        )
    if keep_series:
        run["series"] = series(driven, schedule)
    return run


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
    """The goals, per load and on the mix (see the package docstring)."""
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
