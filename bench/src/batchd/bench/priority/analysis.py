"""What priority.json holds, and the figures: percentiles per class, the goals, Jain's index."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from batchd.bench.kit.goals import Goal
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.stats import median, percentile, ratio
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
class EqualRun:
    """Two classes of one priority, half the load each."""

    gold: ClassRun
    silver: ClassRun
    gold_displaced: int  # items of the class whose place the other took (the replica's count)
    silver_displaced: int

    @property
    def served_ratio(self) -> float:
        """The more served class's answers over the other's (1: equal)."""
        most, least = (
            max(self.gold.answered, self.silver.answered),
            min(self.gold.answered, self.silver.answered),
        )
        return most / least if least else math.inf


@dataclass(frozen=True)
class DeadRun:
    """A high class that keeps every batch full, beside a low class whose requests give up."""

    high_answered: int
    high_p99_ms: float
    low_answered: int
    gave_up: int  # requests whose deadline passed while they waited (the replica's 504s)
    live_refused: int  # requests refused while their clients still waited (queue full, shed, displaced)


@dataclass(frozen=True)
class StreamedRun:
    """One class of streamed generation requests: times to first token, from when each was due."""

    offered: int
    answered: int
    refused: int  # 503s
    shed: int  # of those, `batchd-refused: shed`
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True)
class GenerationRun:
    idle_high: StreamedRun
    high: StreamedRun
    bulk: StreamedRun


@dataclass(frozen=True)
class Results:
    meta: RunRecord
    options: Options
    capacity_rps: float
    priority: dict[str, list[PriorityRun]]  # by subject, one per repeat
    fairness: dict[str, list[FairnessRun]]
    equal: dict[str, list[EqualRun]] = field(default_factory=dict)
    dead: dict[str, list[DeadRun]] = field(default_factory=dict)
    generation: dict[str, list[GenerationRun]] = field(default_factory=dict)


def class_run(offered: int, latencies_s: list[float], dues_s: list[float], refused: int) -> ClassRun:
    ms = [latency * 1000 for latency in latencies_s]
    return ClassRun(offered, len(ms), refused, percentile(ms, 50), percentile(ms, 99), dues_s, ms)


def streamed_run(offered: int, first_tokens_s: list[float], refused: int, shed: int) -> StreamedRun:
    ms = [seconds * 1000 for seconds in first_tokens_s]
    return StreamedRun(offered, len(ms), refused, shed, percentile(ms, 50), percentile(ms, 99))


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


def equal_medians(runs: list[EqualRun]) -> dict[str, float]:
    return {
        "gold served": median([run.gold.answered for run in runs]),
        "silver served": median([run.silver.answered for run in runs]),
        "served ratio": median([run.served_ratio for run in runs]),
        "gold p99 ms": median([run.gold.p99_ms for run in runs]),
        "silver p99 ms": median([run.silver.p99_ms for run in runs]),
        "displaced": sum(run.gold_displaced + run.silver_displaced for run in runs),
    }


def dead_medians(runs: list[DeadRun]) -> dict[str, float]:
    return {
        "high served": median([run.high_answered for run in runs]),
        "high p99 ms": median([run.high_p99_ms for run in runs]),
        "low served": median([run.low_answered for run in runs]),
        "low gave up": median([run.gave_up for run in runs]),
        "live refused": sum(run.live_refused for run in runs),
    }


def generation_medians(runs: list[GenerationRun]) -> dict[str, float]:
    return {
        "idle high p99 ms": median([run.idle_high.p99_ms for run in runs]),
        "high p50 ms": median([run.high.p50_ms for run in runs]),
        "high p99 ms": median([run.high.p99_ms for run in runs]),
        "high 503s": sum(run.high.refused for run in runs),
        "bulk served": median([run.bulk.answered for run in runs]),
        "bulk p99 ms": median([run.bulk.p99_ms for run in runs]),
        "bulk shed": sum(run.bulk.shed for run in runs),
    }


def _within(name: str, loaded_ms: float, idle_ms: float, times: float) -> Goal:
    """A p99 under load within `times` its idle p99 (one not measured misses it, as NaN compares)."""
    return Goal(name, ratio(loaded_ms, idle_ms), times, loaded_ms <= times * idle_ms)


def goals(results: Results) -> list[Goal]:
    """The goals, for the `priority` subject."""
    figures = medians(results.priority["priority"])
    fairness = median([run.jain for run in results.fairness["priority"]])
    found = [
        _within(
            "high-priority p99 within 1.25x its p99 on an idle replica",
            figures["high p99 ms"],
            figures["idle high p99 ms"],
            1.25,
        ),
        Goal("no high-priority request shed", figures["high 503s"], 0, figures["high 503s"] == 0),
        Goal("Jain's fairness index of the two callers at least 0.95", fairness, 0.95, fairness >= 0.95),
    ]
    if results.equal.get("priority"):
        equal = equal_medians(results.equal["priority"])
        found.append(
            Goal(
                "equal classes served within 1.2x of each other, neither displacing the other",
                equal["served ratio"],
                1.2,
                equal["served ratio"] <= 1.2 and equal["displaced"] == 0,
                detail=f"{equal['displaced']:g} displaced",
            )
        )
    if results.dead.get("priority"):
        refused = dead_medians(results.dead["priority"])["live refused"]
        found.append(Goal("no live request refused while dead ones hold places", refused, 0, refused == 0))
    if results.generation.get("priority"):
        generation = generation_medians(results.generation["priority"])
        found.append(
            _within(
                "high-priority time to first token p99 within 1.25x its idle p99",
                generation["high p99 ms"],
                generation["idle high p99 ms"],
                1.25,
            )
        )
    return found
