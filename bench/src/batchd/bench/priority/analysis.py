"""What priority.json holds, and the figures: percentiles per class, the goals, Jain's index."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.stats import median, percentile
from batchd.bench.priority.workload import Options


@dataclass(frozen=True)
class ClassRun:
    """One class under one load, one repeat."""

    offered: int
    answered: int
    refused: int  # 503s
    p50_ms: float
    p99_ms: float
    series_due_s: list[float] = field(default_factory=list)  # when each answered request was due
    series_ms: list[float] = field(default_factory=list)  # and its latency


@dataclass(frozen=True)
class PriorityRun:
    idle_high: ClassRun
    high: ClassRun
    low: ClassRun


@dataclass(frozen=True)
class FairnessRun:
    heavy_rps: float
    light_rps: float

    @property
    def jain(self) -> float:
        return jain([self.heavy_rps, self.light_rps])


@dataclass(frozen=True)
class Results:
    meta: RunRecord
    options: Options
    capacity_rps: float
    priority: dict[str, list[PriorityRun]]  # by subject, one per repeat
    fairness: dict[str, list[FairnessRun]]


def class_run(offered: int, latencies_s: list[float], dues_s: list[float], refused: int) -> ClassRun:
    ms = [latency * 1000 for latency in latencies_s]
    return ClassRun(offered, len(ms), refused, percentile(ms, 50), percentile(ms, 99), dues_s, ms)


def jain(shares: list[float]) -> float:
    """Jain's fairness index: 1 when every share is equal, 1/n when one takes everything."""
    total, squares = sum(shares), sum(share * share for share in shares)
    return total * total / (len(shares) * squares) if squares else math.nan


def medians(runs: list[PriorityRun]) -> dict[str, float]:
    return {
        "idle high p99 ms": median([run.idle_high.p99_ms for run in runs]),
        "high p50 ms": median([run.high.p50_ms for run in runs]),
        "high p99 ms": median([run.high.p99_ms for run in runs]),
        "high 503s": sum(run.high.refused for run in runs),
        "low p50 ms": median([run.low.p50_ms for run in runs]),
        "low p99 ms": median([run.low.p99_ms for run in runs]),
        "low 503s": sum(run.low.refused for run in runs),
    }


def goals(results: Results) -> dict[str, bool]:
    """The goals, for the `priority` subject."""
    figures = medians(results.priority["priority"])
    fairness = median([run.jain for run in results.fairness["priority"]])
    return {
        "high-priority p99 within 1.25x its p99 on an idle replica": figures["high p99 ms"]
        <= 1.25 * figures["idle high p99 ms"],
        "no high-priority request shed": figures["high 503s"] == 0,
        "Jain's fairness index of the two callers at least 0.95": fairness >= 0.95,
    }
