"""Summaries over repeats, the ratios the README quotes, the target checks, and the markdown table."""

from __future__ import annotations

import math

import pytest

from batchd.bench.scenarios.analysis import PointRun, check_targets, compute_ratios, summarise_point
from batchd.bench.scenarios.report import to_markdown


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


def point(subject: str, concurrency: int, rps: float) -> dict[str, object]:
    return {
        "subject": subject,
        "mode": "closed",
        "concurrency": concurrency,
        "rate_rps": None,
        "summary": summarise_point([run(rps)]),
    }


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
    scenario = {
        "points": [
            point("batched", 8, 100),
            point("batched", 32, 270),
            point("unbatched", 8, 60),
            point("unbatched", 32, 50),
            point("floor", 32, 1000),
        ],
        "ceiling": {
            "threads": 2,
            "raw": [{"batch_size": 1, "items_per_s": 80.0}, {"batch_size": 32, "items_per_s": 300.0}],
            "replica": [{"batch_size": 32, "items_per_s": 285.0}],
        },
    }
    ratios = compute_ratios(scenario)
    assert ratios["batched_over_unbatched"] == pytest.approx(4.5)
    assert ratios["server_over_ceiling"] == pytest.approx(0.9)
    assert ratios["batched_over_floor"] == pytest.approx(0.27)
    assert ratios["unbatched_over_ceiling_batch1"] == pytest.approx(0.75)
    assert ratios["model_layer_over_ceiling"] == pytest.approx(0.95)


def test_no_ceiling_means_no_ceiling_ratios() -> None:
    ratios = compute_ratios({"points": [point("batched", 8, 100)], "ceiling": None})
    assert "server_over_ceiling" not in ratios
    assert math.isnan(ratios["batched_over_unbatched"])


def test_targets_say_met_missed_or_not_measured() -> None:
    result = {
        "scenarios": {
            "minilm": {
                "ratios": {"server_over_ceiling": 0.95, "batched_over_unbatched": 3.0},
                "subjects": {"batched": {"idle_rss_mb": 450.0}},
            },
        }
    }
    checks = {c.target: c.met for c in check_targets(result)}
    assert checks["MiniLM throughput >= 90% of the model's batch-32 ceiling"] is True
    assert checks["MiniLM batched >= 3.5x unbatched"] is False
    assert checks["Trivial handler >= 50% of the bare-uvicorn floor"] is None
    assert checks["MiniLM replica idle RSS < 600 MB"] is True


def test_markdown_has_a_row_per_point_and_the_targets() -> None:
    scenario = {
        "title": "Trivial",
        "max_batch_size": 32,
        "ceiling": None,
        "subjects": {"batched": {"idle_rss_mb": 80.0, "peak_rss_mb": 90.0}},
        "points": [point("batched", 8, 1234.5), point("floor", 8, 5000)],
    }
    scenario["ratios"] = compute_ratios(scenario)
    result = {
        "meta": {
            "date": "2026-01-01 00:00 UTC",
            "machine": "2 cores",
            "command": "python -m batchd.bench",
            "repeats": 1,
            "duration_s": 1.0,
        },
        "scenarios": {"trivial": scenario},
    }
    result["targets"] = check_targets(result)
    text = to_markdown(result)
    assert "| batched | closed, 8 clients | 1,234.5 | 1,234.5 |" in text
    assert "| floor | closed, 8 clients | 5,000.0 | 5,000.0 |" in text
    assert "| Trivial handler >= 50% of the bare-uvicorn floor | 0.25 | - | **no** |" in text
    assert "2026-01-01 00:00 UTC" in text


def test_best_ratios_compare_best_repeats_with_the_best_ceiling_run() -> None:
    batched = {
        "subject": "batched",
        "mode": "closed",
        "concurrency": 32,
        "rate_rps": None,
        "summary": summarise_point([run(100), run(280), run(120)]),
    }
    scenario = {
        "points": [batched],
        "ceiling": {
            "threads": 2,
            "raw": [{"batch_size": 32, "items_per_s": 150.0, "best_items_per_s": 300.0}],
        },
    }
    assert compute_ratios(scenario)["server_over_ceiling"] == pytest.approx(120 / 150)
    assert compute_ratios(scenario, "best_throughput_rps")["server_over_ceiling"] == pytest.approx(280 / 300)
