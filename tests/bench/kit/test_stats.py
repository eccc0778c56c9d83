"""The numbers the benchmark report prints: percentiles, medians and ratios."""

from __future__ import annotations

import math

import pytest

from batchd.bench.kit.stats import LatencySummary, mean, median, p99_ms, percentile, ratio


def test_percentile_interpolates_between_ranks_like_numpy() -> None:
    values = [10.0, 1.0, 4.0, 3.0, 2.0]  # unsorted on purpose
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 3.0
    assert percentile(values, 100) == 10.0
    assert percentile(values, 95) == pytest.approx(4.0 + (10.0 - 4.0) * 0.8)
    assert percentile([1.0, 2.0], 50) == 1.5


def test_percentile_of_nothing_is_nan_and_bad_q_is_refused() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match=r"q: expected 0\.\.100, got 101"):
        percentile([1.0], 101)


def test_median_ignores_failed_repeats() -> None:
    assert median([5.0, math.nan, 1.0, 3.0]) == 3.0
    assert math.isnan(median([math.nan]))


def test_ratio_is_nan_when_a_side_is_missing_or_zero() -> None:
    assert ratio(300.0, 100.0) == 3.0
    assert math.isnan(ratio(1.0, 0.0))
    assert math.isnan(ratio(math.nan, 2.0))
    assert math.isnan(ratio(2.0, math.nan))


def test_latency_summary_is_in_milliseconds() -> None:
    summary = LatencySummary.of([0.001 * n for n in range(1, 101)])  # 1 ms .. 100 ms
    assert summary.p50_ms == pytest.approx(50.5)
    assert summary.p99_ms == pytest.approx(99.01)
    assert summary.mean_ms == pytest.approx(50.5)
    assert summary.max_ms == pytest.approx(100)
    assert math.isnan(LatencySummary.of([]).p95_ms)


def test_mean_and_p99_of_nothing_are_nan() -> None:
    assert mean([1.0, 2.0, 6.0]) == 3.0
    assert math.isnan(mean([]))
    assert p99_ms([0.001 * n for n in range(1, 101)]) == pytest.approx(99.01)
    assert math.isnan(p99_ms([]))
