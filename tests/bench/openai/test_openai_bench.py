"""The OpenAI benchmark's arithmetic (medians over repeats, the shares its goals compare), its
report, its command line, and one smoke-sized run of its embeddings part."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from batchd.bench.kit.records import RunRecord
from batchd.bench.openai.analysis import (
    EmbeddingRun,
    Results,
    StreamingRun,
    embedding_points,
    rate_between_completions,
    streaming_points,
)
from batchd.bench.openai.report import EMBEDDINGS_HEAD, STREAMING_HEAD, goals, to_markdown
from tests.bench.conftest import RunModule

META = RunRecord("2026-01-01 00:00 UTC", "test machine", "python -m batchd.bench.openai")


def test_points_are_medians_over_repeats_and_the_share_pairs_the_windows_of_each_repeat() -> None:
    openai = [(99, 20), (60, 10), (40, 30)]  # the machine's load changes from repeat to repeat
    runs = [EmbeddingRun("openai", 8, repeat, rps, p99, 0) for repeat, (rps, p99) in enumerate(openai)]
    runs += [EmbeddingRun("kserve_v1", 8, repeat, rps, 12, 1) for repeat, rps in enumerate((100, 60, 50))]
    (point,) = embedding_points(runs)
    assert point.requests_per_s == {"kserve_v1": 60, "openai": 60} and point.p99_ms["openai"] == 20
    assert point.throughput_share == 0.99 and point.errors == 3  # the repeats' ratios: 0.99, 1.0, 0.8


def test_streaming_compares_tokens_per_second_and_time_to_first_token() -> None:
    runs = [
        StreamingRun("openai", 4, 0, 400, 50, 25, 0),
        StreamingRun("oip_generate_stream", 4, 0, 500, 40, 31, 0),
    ]
    (point,) = streaming_points(runs)
    assert point.throughput_share == 0.8 and point.ttft_share == 0.8


def test_the_time_to_first_token_p99_is_taken_over_every_repeats_samples_together() -> None:
    # One late first token in 100 is the OpenAI route's p99 no more than a single sample; two in 100
    # are generate_stream's. Each window alone (50 samples) would make its one late token its p99.
    runs = [
        StreamingRun("openai", 16, 0, 100, 50.8, 50, 0, [10.0] * 49 + [90.0]),
        StreamingRun("openai", 16, 1, 100, 10.0, 50, 0, [10.0] * 50),
        StreamingRun("oip_generate_stream", 16, 0, 100, 10.0, 50, 0, [10.0] * 50),
        StreamingRun("oip_generate_stream", 16, 1, 100, 30.0, 50, 0, [10.0] * 48 + [30.0] * 2),
    ]
    (point,) = streaming_points(runs)
    assert point.ttft_p99_ms["openai"] == pytest.approx(10.8)  # between the 99th and 100th sample
    assert point.ttft_p99_ms["oip_generate_stream"] == pytest.approx(30.0)
    assert point.ttft_share == pytest.approx(30.0 / 10.8)


def results(share: float) -> Results:
    embeddings = embedding_points(
        [EmbeddingRun("openai", 1, 0, 100 * share, 10, 0), EmbeddingRun("kserve_v1", 1, 0, 100, 10, 0)]
    )
    streaming = streaming_points(
        [
            StreamingRun("openai", 1, 0, 100, 10, 5, 0),
            StreamingRun("oip_generate_stream", 1, 0, 100, 10, 5, 0),
        ]
    )
    return Results(META, 3, 1, embeddings, streaming, [], [])


def test_the_report_has_both_tables_and_says_whether_each_goal_was_met() -> None:
    report = to_markdown(results(0.97))
    assert EMBEDDINGS_HEAD in report and STREAMING_HEAD in report and "| 1 | 97 | 100 | 97.0% |" in report
    assert [goal.met for goal in goals(results(0.97))] == [True, True]
    assert goals(results(0.9))[0].met is False


def test_a_count_below_one_is_refused_naming_the_option(run_module: RunModule) -> None:
    done = run_module("batchd.bench.openai", "--repeats", "0", timeout_s=60)
    assert done.returncode == 2 and "--repeats: expected 1 or more, got 0" in done.stderr


@pytest.mark.slow
def test_a_smoke_sized_run_compares_the_embedding_routes(run_module: RunModule, tmp_path: Path) -> None:
    done = run_module(
        "batchd.bench.openai", "--quick", "--parts", "embeddings", "--output-dir", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads((tmp_path / "openai.json").read_text())
    points = written["embeddings"]
    assert [p["clients"] for p in points] == [1, 8] and written["streaming"] == []
    # A share the window could not measure is written as null (JSON has no NaN).
    assert all(p["errors"] == 0 and p["throughput_share"] is not None for p in points), points
    assert "/v1/embeddings req/s" in (tmp_path / "openai.md").read_text()


def test_the_rate_counts_between_completions_so_waves_of_answers_do_not_skew_it() -> None:
    waves = [1.0] * 32 + [2.0] * 32 + [3.0] * 32  # batches of 32, one a second
    assert rate_between_completions(waves) == 32.0  # whatever the window's edges cut of the waves
    assert math.isnan(rate_between_completions([1.0]))
