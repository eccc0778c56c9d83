"""The demo's report: one line per server, and what batching bought."""

from __future__ import annotations

from collections.abc import Sequence

from batchd.bench.demo.workload import Outcome
from batchd.bench.kit import formatting
from batchd.bench.kit.stats import LatencySummary, ratio


def report(outcomes: Sequence[Outcome], concurrency: int) -> str:
    """The table the demo prints; the first outcome is the batched server, the second the unbatched."""
    requests = outcomes[0].run.completed
    lines = [
        "",
        f"MiniLM-L6 embeddings, {requests} requests from {concurrency} concurrent clients:",
        "",
        f"  {'server':<28} {'req/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}  batch sizes formed",
    ]
    for outcome in outcomes:
        latency = LatencySummary.of(outcome.run.latencies_s)
        sizes = " ".join(f"{k}:{v}" for k, v in outcome.batch_sizes.distribution().items())
        title = f"{outcome.label} (max_batch_size {outcome.max_batch_size})"
        figures = (outcome.run.throughput_rps, latency.p50_ms, latency.p95_ms, latency.p99_ms)
        cells = " ".join(f"{formatting.number(value):>8}" for value in figures)
        lines.append(f"  {title:<28} {cells}  mean {formatting.number(outcome.batch_sizes.mean)} ({sizes})")
    batched, unbatched = outcomes
    speedup = ratio(batched.run.throughput_rps, unbatched.run.throughput_rps)
    lines += [
        "",
        f"  Batching served {formatting.number(speedup)}x the requests per second of one-at-a-time serving.",
        "  (Batch sizes come from the server's own batchd_batch_size histogram on /metrics.)",
    ]
    return "\n".join(lines)
