"""Summary statistics for benchmark runs: percentiles, medians over repeats, and the ratios we quote.

Kept free of I/O so that the numbers a report prints can be unit-tested.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


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


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when either is missing or the denominator is zero."""
    if math.isnan(numerator) or math.isnan(denominator) or denominator == 0:
        return math.nan
    return numerator / denominator


def latency_summary(latencies_s: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99 and the mean, in milliseconds (the unit people read latency in)."""
    return {
        "p50_ms": percentile(latencies_s, 50) * 1000,
        "p95_ms": percentile(latencies_s, 95) * 1000,
        "p99_ms": percentile(latencies_s, 99) * 1000,
        "mean_ms": (sum(latencies_s) / len(latencies_s) * 1000) if latencies_s else math.nan,
    }
