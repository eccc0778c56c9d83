"""Turning outcomes into figures: per run, medians over repeats, and where the modes compare."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from batchd.bench.generation.workload import MODES, Job, Outcome
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.stats import median, percentile, ratio

SATURATED = 0.9  # completing under this share of the offered tokens/s: saturated


@dataclass(frozen=True)
class Latencies:
    """Time to first token and end to end, from when each request was due, in milliseconds."""

    ttft_p50_ms: float
    ttft_p99_ms: float
    e2e_p50_ms: float
    e2e_p99_ms: float


@dataclass(frozen=True)
class RunSummary:
    """One mode at one rate, one repeat."""

    rate_rps: float
    requests: int
    completed: int
    errors: int
    error_samples: list[str]
    output_tokens: int
    tokens_per_s: float  # output tokens of all requests over first arrival to last answer
    offered_tokens_per_s: float
    latency: Latencies


@dataclass(frozen=True)
class RatePoint:
    """One mode at one rate: medians over the repeats (errors and requests summed)."""

    rate_rps: float
    tokens_per_s: float
    offered_tokens_per_s: float
    latency: Latencies
    errors: int
    requests: int


@dataclass(frozen=True)
class Comparison:
    """Where request-level batching saturates, and token- over request-level there."""

    request_level_saturates_at_rps: float | None  # None: it kept up at every rate
    compared_at_rps: float
    throughput_ratio: float
    ttft_p99_ratio: float
    e2e_p99_ratio: float
    best_tokens_per_s: dict[str, float]


def summarise(jobs: Sequence[Job], outcomes: Sequence[Outcome], rate: float, duration_s: float) -> RunSummary:
    answered = [(o, o.first_s, o.done_s) for o in outcomes if o.error is None]
    ok = [(o, first, done) for o, first, done in answered if first is not None and done is not None]
    tokens = sum(o.tokens for o, _, _ in ok)
    span = max(done for _, _, done in ok) - min(o.due_s for o in outcomes) if ok else math.nan
    firsts = [first - o.due_s for o, first, _ in ok]
    ends = [done - o.due_s for o, _, done in ok]
    return RunSummary(
        rate_rps=rate,
        requests=len(outcomes),
        completed=len(ok),
        errors=len(outcomes) - len(ok),
        error_samples=[o.error for o in outcomes if o.error][:3],
        output_tokens=tokens,
        tokens_per_s=tokens / span if ok and span > 0 else math.nan,
        offered_tokens_per_s=sum(job.new_tokens for job in jobs) / duration_s,
        latency=Latencies(
            ttft_p50_ms=percentile(firsts, 50) * 1000,
            ttft_p99_ms=percentile(firsts, 99) * 1000,
            e2e_p50_ms=percentile(ends, 50) * 1000,
            e2e_p99_ms=percentile(ends, 99) * 1000,
        ),
    )


def medians_over_repeats(rate: float, runs: Sequence[RunSummary]) -> RatePoint:
    return RatePoint(
        rate_rps=rate,
        tokens_per_s=median([run.tokens_per_s for run in runs]),
        offered_tokens_per_s=median([run.offered_tokens_per_s for run in runs]),
        latency=Latencies(
            ttft_p50_ms=median([run.latency.ttft_p50_ms for run in runs]),
            ttft_p99_ms=median([run.latency.ttft_p99_ms for run in runs]),
            e2e_p50_ms=median([run.latency.e2e_p50_ms for run in runs]),
            e2e_p99_ms=median([run.latency.e2e_p99_ms for run in runs]),
        ),
        errors=sum(run.errors for run in runs),
        requests=sum(run.requests for run in runs),
    )


def compare(medians: dict[str, list[RatePoint]]) -> Comparison:
    """Where request-level batching saturates, and token- over request-level there."""
    request = medians["request"]
    token = {point.rate_rps: point for point in medians["token"]}
    saturated = [p for p in request if p.tokens_per_s < SATURATED * p.offered_tokens_per_s]
    at = saturated[0] if saturated else request[-1]
    other = token[at.rate_rps]
    return Comparison(
        request_level_saturates_at_rps=at.rate_rps if saturated else None,
        compared_at_rps=at.rate_rps,
        throughput_ratio=ratio(other.tokens_per_s, at.tokens_per_s),
        ttft_p99_ratio=ratio(at.latency.ttft_p99_ms, other.latency.ttft_p99_ms),
        e2e_p99_ratio=ratio(at.latency.e2e_p99_ms, other.latency.e2e_p99_ms),
        best_tokens_per_s={mode: max(p.tokens_per_s for p in medians[mode]) for mode in MODES},
    )


@dataclass(frozen=True)
class ModelResult:
    """One model: both modes at every rate, medians and every repeat."""

    title: str
    config: dict[str, int]
    rates_rps: list[float]
    duration_s: float
    repeats: int
    torch_threads: int
    medians: dict[str, list[RatePoint]]  # by mode, one point per rate
    comparison: Comparison
    runs: dict[str, dict[str, list[RunSummary]]]  # by mode, then rate


@dataclass(frozen=True)
class Results:
    """What generation.json holds."""

    meta: RunRecord
    device: str
    models: dict[str, ModelResult]
