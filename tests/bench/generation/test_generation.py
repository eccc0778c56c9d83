"""The generation benchmark's arithmetic: the workload it sends, what it counts, where it compares."""

from __future__ import annotations

import math

from batchd.bench.generation.analysis import Latencies, ModelResult, RatePoint, Results, compare, summarise
from batchd.bench.generation.report import TABLE_HEAD, to_markdown, verdict
from batchd.bench.generation.workload import Job, Outcome, workload
from batchd.bench.kit.records import RunRecord


class WordTokenizer:
    """One token per word: enough to check prompt lengths without a model."""

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": list(range(len(text.split())))}


def test_the_workload_is_poisson_arrivals_with_prompts_and_lengths_in_range() -> None:
    jobs = workload(WordTokenizer(), rate=8, duration_s=30, seed=3)
    assert 180 < len(jobs) < 300 and all(0 <= job.due_s < 30 for job in jobs)
    assert [job.due_s for job in jobs] == sorted(job.due_s for job in jobs)
    assert all(4 <= job.prompt_tokens <= 64 and 8 <= job.new_tokens <= 256 for job in jobs)
    assert jobs == workload(WordTokenizer(), rate=8, duration_s=30, seed=3), "the same seed, other requests"


def test_a_run_counts_tokens_over_first_arrival_to_last_answer_and_latency_from_when_due() -> None:
    jobs = [Job(0.0, "a b c d", 4, 10), Job(1.0, "a b c d", 4, 30), Job(2.0, "a b c d", 4, 20)]
    outcomes = [
        Outcome(0.0, 0.1, 1.0, 10),
        Outcome(1.0, 1.5, 3.0, 30),
        Outcome(2.0, None, None, 0, "503: queue full"),
    ]
    summary = summarise(jobs, outcomes, rate=1.0, duration_s=3.0)
    assert summary.completed == 2 and summary.errors == 1
    assert summary.tokens_per_s == 40 / 3.0 and summary.offered_tokens_per_s == 60 / 3.0
    assert math.isclose(summary.latency.ttft_p50_ms, 300) and math.isclose(summary.latency.e2e_p99_ms, 1990)


def point(rate: float, tokens_per_s: float, offered: float, ttft_p99_ms: float) -> RatePoint:
    latency = Latencies(
        ttft_p50_ms=ttft_p99_ms / 2,
        ttft_p99_ms=ttft_p99_ms,
        e2e_p50_ms=2 * ttft_p99_ms,
        e2e_p99_ms=4 * ttft_p99_ms,
    )
    return RatePoint(rate, tokens_per_s, offered, latency, errors=0, requests=10)


def test_the_comparison_is_made_where_request_level_batching_saturates() -> None:
    medians = {
        "token": [point(2, 260, 264, 30), point(4, 520, 528, 40), point(8, 1000, 1056, 90)],
        "request": [point(2, 262, 264, 600), point(4, 420, 528, 4000), point(8, 430, 1056, 9000)],
    }
    comparison = compare(medians)
    assert comparison.request_level_saturates_at_rps == 4
    assert comparison.throughput_ratio == 520 / 420 and comparison.ttft_p99_ratio == 100
    assert "saturates at 4 req/s" in verdict(comparison)
    model = ModelResult("a model", {}, [2, 4, 8], 10, 1, 1, medians, comparison, runs={})
    meta = RunRecord("today", "here", "python -m batchd.bench.generation")
    report = to_markdown(Results(meta, "cpu", {"tiny": model}))
    assert report.count("| 4 | token |") == 1 and "**1.24x**" in report and TABLE_HEAD in report
