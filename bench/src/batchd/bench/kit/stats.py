"""Summary statistics for benchmark runs: percentiles, medians over repeats, and the ratios we quote.

One percentile for every benchmark (numpy's default interpolation), so that a p99 means the same
in every report. Kept free of I/O so that the numbers a report prints can be unit-tested.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between closest ranks (numpy's default).

    NaN for no values: a run that answered nothing has no latency, and the report says so.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"q: expected 0..100, got {q!r}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    """The median, ignoring NaNs (a failed repeat must not erase the others)."""
    clean = [v for v in values if not math.isnan(v)]
    return percentile(clean, 50)


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean; NaN for no values."""
    return sum(values) / len(values) if values else math.nan


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when either is missing or the denominator is zero."""
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator


@dataclass(frozen=True)
class LatencySummary:
    """p50/p95/p99, the mean and the maximum, in milliseconds (the unit people read latency in);
    NaN for a run that answered nothing."""

    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float

    @classmethod
    def of(cls, latencies_s: Sequence[float]) -> LatencySummary:
        return cls(
            p50_ms=percentile(latencies_s, 50) * 1000,
            p95_ms=percentile(latencies_s, 95) * 1000,
            p99_ms=percentile(latencies_s, 99) * 1000,
            mean_ms=mean(latencies_s) * 1000,
            max_ms=max(latencies_s) * 1000 if latencies_s else math.nan,
        )


def p99_ms(latencies_s: Sequence[float]) -> float:
    """The p99 of latencies in seconds, in milliseconds (NaN for none)."""
    return percentile(latencies_s, 99) * 1000
