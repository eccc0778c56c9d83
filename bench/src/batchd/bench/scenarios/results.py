"""What latest.json holds, as frozen dataclasses: every load run, every (server, load) point over
its repeats, the ceilings, each scenario and the targets."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from batchd.bench.kit.records import RunRecord

NAN = math.nan


@dataclass(frozen=True)
class PointRun:
    """One load run against one server: what the clients saw, and the server's own figures."""

    throughput_rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    completed: int
    errors: int
    error_samples: list[str]
    duration_s: float
    client_cpu_s: float
    server_cpu_s: float = 0.0
    server_cpu_share: float = math.nan  # of one core, over the run and its warm-up
    server_peak_rss_mb: float = math.nan
    batch_sizes: dict[str, int] = field(default_factory=dict)  # from the replica's /metrics
    batches: float = 0.0
    batched_items: float = 0.0


@dataclass(frozen=True)
class PointSummary:
    """One (server, load) point over its repeats: medians of what varies, totals of what counts."""

    throughput_rps: float
    best_throughput_rps: float  # noise only ever slows a run on a shared machine: this is capacity
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: int
    completed: int
    batch_sizes: dict[str, int]
    mean_batch_size: float
    server_cpu_ms_per_request: float
    server_cpu_share: float
    client_cpu_share: float
    repeats: int


@dataclass(frozen=True)
class TargetCheck:
    """A target the README quotes, against the medians and against the best repeats."""

    target: str
    value: float
    best_runs_value: float
    threshold: float
    met: bool | None  # None: not measured


@dataclass(frozen=True)
class Point:
    """One server under one load, over the repeats."""

    subject: str  # "floor", "batched" or "unbatched"
    mode: str  # "closed" or "open"
    concurrency: int  # closed loop: clients
    rate_rps: float | None  # open loop: arrivals a second
    summary: PointSummary
    runs: list[PointRun]


@dataclass(frozen=True)
class CeilingEntry:
    """The model alone at one batch size, over the repeats."""

    batch_size: int
    items_per_s: float  # median
    best_items_per_s: float
    batch_latency_ms: float


@dataclass(frozen=True)
class CeilingSummary:
    threads: int
    raw: list[CeilingEntry]  # transformers alone
    replica: list[CeilingEntry]  # the replica's own model layer, in-process
    runs: list[dict[str, Any]]  # as the ceiling process printed them
    replica_error: str | None = None


@dataclass(frozen=True)
class SubjectFigures:
    """One server's process: resident memory idle and at its peak, and how it exited."""

    idle_rss_mb: float
    peak_rss_mb: float = NAN
    exit_status: int | None = None


@dataclass(frozen=True)
class ScenarioResult:
    title: str
    max_batch_size: int
    batch_wait_timeout_s: float
    server_cores: list[int] | None  # None: not pinned
    client_cores: list[int] | None
    open_loop_rate_rps: float | None
    ceiling: CeilingSummary | None
    same_work: dict[str, bool] | None  # whether the servers answered what the ceiling did
    subjects: dict[str, SubjectFigures]
    points: list[Point]
    ratios: dict[str, float] = field(default_factory=dict)  # by name, medians
    ratios_best: dict[str, float] = field(default_factory=dict)  # by name, best repeats


@dataclass(frozen=True)
class BenchRecord(RunRecord):
    """Where, when and how the scenarios ran: the versions measured and the run's options."""

    versions: dict[str, str]
    repeats: int
    duration_s: float
    options: dict[str, Any]


@dataclass(frozen=True)
class BenchResult:
    """latest.json: every scenario that ran, those that could not be measured, and the targets."""

    meta: BenchRecord
    scenarios: dict[str, ScenarioResult]
    failures: dict[str, str]  # scenario -> what went wrong
    targets: list[TargetCheck]
