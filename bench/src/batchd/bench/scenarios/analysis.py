"""Turning runs into results: per-point medians over repeats, the ratios we quote, the targets.

Everything here is pure (runs in, figures out) so it can be unit-tested; the harness
(`batchd.bench.scenarios.harness`) does the measuring and `report` the writing.
"""

from __future__ import annotations

import math
from collections import Counter

from batchd.bench.kit.stats import median, ratio
from batchd.bench.scenarios.results import (
    CeilingSummary,
    Point,
    PointRun,
    PointSummary,
    ScenarioResult,
    TargetCheck,
)

# The targets the README quotes: (title, scenario, ratio, threshold).
TARGETS = (
    ("MiniLM throughput >= 90% of the model's batch-32 ceiling", "minilm", "server_over_ceiling", 0.90),
    ("MiniLM batched >= 3.5x unbatched", "minilm", "batched_over_unbatched", 3.5),
    ("Trivial handler >= 50% of the bare-uvicorn floor", "trivial", "batched_over_floor", 0.50),
)
IDLE_RSS_TARGET_MB = 600.0


def summarise_point(repeats: list[PointRun]) -> PointSummary:
    """Medians over repeats for the figures that vary, totals for errors, merged batch sizes."""
    batch_sizes: Counter[str] = Counter()
    for run in repeats:
        batch_sizes.update(run.batch_sizes)
    completed = sum(run.completed for run in repeats)
    return PointSummary(
        throughput_rps=median([run.throughput_rps for run in repeats]),
        best_throughput_rps=max(run.throughput_rps for run in repeats),
        p50_ms=median([run.p50_ms for run in repeats]),
        p95_ms=median([run.p95_ms for run in repeats]),
        p99_ms=median([run.p99_ms for run in repeats]),
        errors=sum(run.errors for run in repeats),
        completed=completed,
        batch_sizes=dict(sorted(batch_sizes.items(), key=lambda kv: _label_key(kv[0]))),
        mean_batch_size=ratio(sum(run.batched_items for run in repeats), sum(run.batches for run in repeats)),
        server_cpu_ms_per_request=ratio(sum(run.server_cpu_s for run in repeats) * 1000, completed),
        server_cpu_share=median([run.server_cpu_share for run in repeats]),
        client_cpu_share=median([run.client_cpu_s / run.duration_s for run in repeats]),
        repeats=len(repeats),
    )


def _label_key(label: str) -> float:
    return float(label.lstrip(">").split("-")[0])


def best_closed(points: list[Point], subject: str) -> Point | None:
    """The closed-loop point where `subject` reached its highest median throughput."""
    mine = [p for p in points if p.subject == subject and p.mode == "closed"]
    return max(mine, key=lambda p: p.summary.throughput_rps, default=None)


def compute_ratios(
    points: list[Point], ceiling: CeilingSummary | None, figure: str = "throughput_rps"
) -> dict[str, float]:
    """server / ceiling, batched / unbatched and batched / floor, each at every side's best load.

    `figure` is the median throughput over repeats, or `best_throughput_rps` (the best repeat,
    compared with the best ceiling run): the same ratios, with the machine's noise left out.
    """
    best = {s: best_closed(points, s) for s in ("batched", "unbatched", "floor")}
    rps = {s: (getattr(p.summary, figure) if p else math.nan) for s, p in best.items()}
    ratios = {
        "batched_over_unbatched": ratio(rps["batched"], rps["unbatched"]),
        "batched_over_floor": ratio(rps["batched"], rps["floor"]),
        "unbatched_over_floor": ratio(rps["unbatched"], rps["floor"]),
    }
    if ceiling is None or not ceiling.raw:
        return ratios
    best_run = figure == "best_throughput_rps"
    raw = {e.batch_size: e.best_items_per_s if best_run else e.items_per_s for e in ceiling.raw}
    via_replica = {e.batch_size: e.best_items_per_s if best_run else e.items_per_s for e in ceiling.replica}
    largest = max(raw)
    ratios["server_over_ceiling"] = ratio(rps["batched"], raw[largest])
    ratios["unbatched_over_ceiling_batch1"] = ratio(rps["unbatched"], raw.get(1, math.nan))
    ratios["ceiling_batched_over_batch1"] = ratio(raw[largest], raw.get(1, math.nan))
    if via_replica:
        ratios["model_layer_over_ceiling"] = ratio(via_replica.get(largest, math.nan), raw[largest])
        ratios["server_over_model_layer"] = ratio(rps["batched"], via_replica.get(largest, math.nan))
    return ratios


def check_targets(scenarios: dict[str, ScenarioResult]) -> list[TargetCheck]:
    """Each target the README quotes, met, missed or not measured (its scenario did not run)."""
    checks = []
    for title, name, key, threshold in TARGETS:
        scenario = scenarios.get(name)
        value = scenario.ratios.get(key, math.nan) if scenario else math.nan
        best = scenario.ratios_best.get(key, math.nan) if scenario else math.nan
        checks.append(
            TargetCheck(title, value, best, threshold, None if math.isnan(value) else value >= threshold)
        )
    if "minilm" in scenarios:
        batched = scenarios["minilm"].subjects.get("batched")
        idle = batched.idle_rss_mb if batched else math.nan
        met = None if math.isnan(idle) else idle < IDLE_RSS_TARGET_MB
        title = f"MiniLM replica idle RSS < {IDLE_RSS_TARGET_MB:.0f} MB"
        checks.append(TargetCheck(title, idle, idle, IDLE_RSS_TARGET_MB, met))
    return checks
