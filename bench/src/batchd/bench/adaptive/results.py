"""What adaptive.json holds, as frozen dataclasses: per run, per subject and load, the verdicts,
and per model (read back with `kit.records.from_json` to render the report again)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from batchd.bench.adaptive.options import Options
from batchd.bench.kit.records import RunRecord

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
    goals: dict[str, bool]


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
