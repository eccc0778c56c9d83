"""Turning outcomes into figures: per run, medians over repeats, and where the modes compare."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from batchd.bench.generation.workload import MODES, Job, Outcome
from batchd.bench.kit.stats import median, percentile

SATURATED = 0.9  # completing under this share of the offered tokens/s: saturated


def summarise(
    jobs: Sequence[Job], outcomes: Sequence[Outcome], rate: float, duration_s: float
) -> dict[str, Any]:
    answered = [(o, o.first_s, o.done_s) for o in outcomes if o.error is None]
    ok = [(o, first, done) for o, first, done in answered if first is not None and done is not None]
    tokens = sum(o.tokens for o, _, _ in ok)
    span = max(done for _, _, done in ok) - min(o.due_s for o in outcomes) if ok else math.nan
    return {
        "rate_rps": rate,
        "requests": len(outcomes),
        "completed": len(ok),
        "errors": len(outcomes) - len(ok),
        "error_samples": [o.error for o in outcomes if o.error][:3],
        "output_tokens": tokens,
        "tokens_per_s": tokens / span if ok and span > 0 else math.nan,
        "offered_tokens_per_s": sum(job.new_tokens for job in jobs) / duration_s,
        "ttft_p50_ms": percentile([first - o.due_s for o, first, _ in ok], 50) * 1000,
        "ttft_p99_ms": percentile([first - o.due_s for o, first, _ in ok], 99) * 1000,
        "e2e_p50_ms": percentile([done - o.due_s for o, _, done in ok], 50) * 1000,
        "e2e_p99_ms": percentile([done - o.due_s for o, _, done in ok], 99) * 1000,
    }


def medians_over_repeats(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    keys = ("tokens_per_s", "offered_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "e2e_p99_ms")
    result: dict[str, Any] = {key: median([s[key] for s in summaries]) for key in keys}
    result["errors"] = sum(s["errors"] for s in summaries)
    result["requests"] = sum(s["requests"] for s in summaries)
    return result


def compare(medians: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Where request-level batching saturates, and token- over request-level there."""
    request = medians["request"]
    token = {point["rate_rps"]: point for point in medians["token"]}
    saturated = [p for p in request if p["tokens_per_s"] < SATURATED * p["offered_tokens_per_s"]]
    at = saturated[0] if saturated else request[-1]
    other = token[at["rate_rps"]]
    return {
        "request_level_saturates_at_rps": at["rate_rps"] if saturated else None,
        "compared_at_rps": at["rate_rps"],
        "throughput_ratio": other["tokens_per_s"] / at["tokens_per_s"],
        "ttft_p99_ratio": at["ttft_p99_ms"] / other["ttft_p99_ms"],
        "e2e_p99_ratio": at["e2e_p99_ms"] / other["e2e_p99_ms"],
        "best_tokens_per_s": {mode: max(p["tokens_per_s"] for p in medians[mode]) for mode in MODES},
    }
