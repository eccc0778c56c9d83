"""From measurements to what the report says: medians per subject and ratios between subjects.
Pure functions, no I/O."""

from __future__ import annotations

from collections.abc import Sequence

from batchd.bench.kit.stats import median, ratio
from batchd.bench.overhead.results import Measurement, Summary

# What batchd is compared with, in the order a reader asks: the peer, the floor, the code before.
REFERENCES = ("mosec", "bare", "baseline")
FIGURES = ("throughput_rps", "p50_ms", "p99_ms", "server_cpu_ms_per_request")


def summarise(measurements: Sequence[Measurement]) -> list[Summary]:
    """Each subject's medians over its repeats, in the order the subjects first ran."""
    order = list(dict.fromkeys(m.subject for m in measurements))
    summaries = []
    for subject in order:
        runs = [m for m in measurements if m.subject == subject]
        summaries.append(
            Summary(
                subject=subject,
                repeats=len(runs),
                throughput_rps=median([m.throughput_rps for m in runs]),
                p50_ms=median([m.p50_ms for m in runs]),
                p99_ms=median([m.p99_ms for m in runs]),
                server_cpu_ms_per_request=median([m.server_cpu_ms_per_request for m in runs]),
                errors=sum(m.errors for m in runs),
            )
        )
    return summaries


def ratios(summaries: Sequence[Summary], subject: str = "batchd") -> dict[str, dict[str, float]]:
    """`subject`'s median over each reference's that ran, figure by figure: `batchd/mosec` ->
    {"server_cpu_ms_per_request": 0.9, ...} (below 1 is less CPU, or less latency)."""
    by_name = {s.subject: s for s in summaries}
    if subject not in by_name:
        return {}
    mine = by_name[subject]
    return {
        f"{subject}/{reference}": {
            figure: ratio(getattr(mine, figure), getattr(by_name[reference], figure)) for figure in FIGURES
        }
        for reference in REFERENCES
        if reference in by_name
    }
