"""Summaries over repeats, the ratios the README quotes, the target checks, and the markdown table."""

from __future__ import annotations

import math

import pytest

from batchd.bench.scenarios.analysis import check_targets, compute_ratios, summarise_point
from batchd.bench.scenarios.report import to_markdown
from batchd.bench.scenarios.results import (
    BenchRecord,
    BenchResult,
    CeilingEntry,
    CeilingSummary,
    Point,
    PointRun,
    ScenarioResult,
    SubjectFigures,
)


def run(
    rps: float,
    p50: float = 10.0,
    errors: int = 0,
    sizes: dict[str, int] | None = None,
    batches: float = 0,
    items: float = 0,
) -> PointRun:
    return PointRun(
        throughput_rps=rps,
        p50_ms=p50,
        p95_ms=p50 * 2,
        p99_ms=p50 * 3,
        completed=int(rps),
        errors=errors,
        error_samples=[],
        duration_s=1.0,
        client_cpu_s=0.1,
        server_cpu_s=0.5,
        batch_sizes=sizes or {},
        batches=batches,
        batched_items=items,
    )


def point(subject: str, concurrency: int, *rps: float) -> Point:
    runs = [run(each) for each in rps]
    return Point(subject, "closed", concurrency, None, summarise_point(runs), runs)


def ceiling(*entries: tuple[int, float, float], replica: tuple[int, float] | None = None) -> CeilingSummary:
    """Ceiling entries as (batch size, median items/s, best items/s)."""
    raw = [CeilingEntry(size, median, best, 1.0) for size, median, best in entries]
    via = [CeilingEntry(replica[0], replica[1], replica[1], 1.0)] if replica else []
    return CeilingSummary(threads=2, raw=raw, replica=via, runs=[])


def scenario(points: list[Point], ratios: dict[str, float], idle_rss_mb: float = 80.0) -> ScenarioResult:
    subjects = {"batched": SubjectFigures(idle_rss_mb, 90.0, 0)}
    return ScenarioResult("Trivial", 32, 0.0, None, None, None, None, None, subjects, points, ratios)


def test_summary_takes_medians_and_sums_errors_and_batches() -> None:
    summary = summarise_point(
        [
            run(100, p50=5, errors=1, sizes={"17-32": 3}, batches=3, items=90),
            run(300, p50=50, sizes={"17-32": 1, "1": 2}, batches=3, items=32),
            run(200, p50=7, errors=2, sizes={"1": 1}, batches=1, items=1),
        ]
    )
    assert summary.throughput_rps == 200
    assert summary.p50_ms == 7
    assert summary.errors == 3
    assert summary.batch_sizes == {"1": 3, "17-32": 4}  # ordered by size
    assert summary.mean_batch_size == pytest.approx(123 / 7)
    assert summary.server_cpu_ms_per_request == pytest.approx(1500 / 600)


def test_ratios_compare_each_side_at_its_best_load() -> None:
    points = [
        point("batched", 8, 100),
        point("batched", 32, 270),
        point("unbatched", 8, 60),
        point("unbatched", 32, 50),
        point("floor", 32, 1000),
    ]
    ratios = compute_ratios(points, ceiling((1, 80.0, 80.0), (32, 300.0, 300.0), replica=(32, 285.0)))
    assert ratios["batched_over_unbatched"] == pytest.approx(4.5)
    assert ratios["server_over_ceiling"] == pytest.approx(0.9)
    assert ratios["batched_over_floor"] == pytest.approx(0.27)
    assert ratios["unbatched_over_ceiling_batch1"] == pytest.approx(0.75)
    assert ratios["model_layer_over_ceiling"] == pytest.approx(0.95)


def test_no_ceiling_means_no_ceiling_ratios() -> None:
    ratios = compute_ratios([point("batched", 8, 100)], None)
    assert "server_over_ceiling" not in ratios
    assert math.isnan(ratios["batched_over_unbatched"])


def test_targets_say_met_missed_or_not_measured() -> None:
    minilm = scenario([], {"server_over_ceiling": 0.95, "batched_over_unbatched": 3.0}, idle_rss_mb=450.0)
    checks = {c.target: c.met for c in check_targets({"minilm": minilm})}
    assert checks["MiniLM throughput >= 90% of the model's batch-32 ceiling"] is True
    assert checks["MiniLM batched >= 3.5x unbatched"] is False
    assert checks["Trivial handler >= 50% of the bare-uvicorn floor"] is None
    assert checks["MiniLM replica idle RSS < 600 MB"] is True


def test_markdown_has_a_row_per_point_and_the_targets() -> None:
    points = [point("batched", 8, 1234.5), point("floor", 8, 5000)]
    trivial = scenario(points, compute_ratios(points, None))
    meta = BenchRecord("2026-01-01 00:00 UTC", "2 cores", "python -m batchd.bench", {}, 1, 1.0, {})
    text = to_markdown(BenchResult(meta, {"trivial": trivial}, {}, check_targets({"trivial": trivial})))
    assert "| batched | closed, 8 clients | 1,234.5 | 1,234.5 |" in text
    assert "| floor | closed, 8 clients | 5,000.0 | 5,000.0 |" in text
    assert "| Trivial handler >= 50% of the bare-uvicorn floor | 0.25 | - | **no** |" in text
    assert "2026-01-01 00:00 UTC" in text


def test_best_ratios_compare_best_repeats_with_the_best_ceiling_run() -> None:
    points = [point("batched", 32, 100, 280, 120)]
    best_of = ceiling((32, 150.0, 300.0))
    assert compute_ratios(points, best_of)["server_over_ceiling"] == pytest.approx(120 / 150)
    assert compute_ratios(points, best_of, "best_throughput_rps")["server_over_ceiling"] == pytest.approx(
        280 / 300
    )
