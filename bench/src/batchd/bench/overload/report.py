"""What the overload run promises, checked, and overload.md."""

from __future__ import annotations

from batchd.bench.kit.formatting import number, share
from batchd.bench.kit.goals import Goal, at_most, bullets
from batchd.bench.overload.workload import Overload


def goals(report: Overload) -> list[Goal]:
    """The promises of the package docstring, as checks on a run."""
    allowed = {"200", "429", "503"}
    others = sum(count for status, count in report.statuses.items() if status not in allowed)
    unusable = others + report.refusals_without_retry_after + report.unanswered
    return [
        # Any status outside the allowed ones fails the goal, even one counted zero times.
        Goal(
            "only 200, or 503/429 with Retry-After",
            unusable,
            0,
            unusable == 0 and set(report.statuses) <= allowed,
        ),
        at_most("resident memory flat (within 10% after warm-up)", report.rss_growth, 0.10),
        at_most("full service within a second of the load ending", report.recovery_s, 1.0),
    ]


def markdown(report: Overload) -> str:
    offered, capacity = report.offered_rate_per_s, report.capacity_items_per_s
    lines = [
        f"Open loop at {offered:.0f} req/s ({offered / capacity:.0f}x capacity, {capacity:.0f} items/s) "
        f"for {report.duration_s:.0f} s: {report.requests} requests.",
        "",
        "| measure | value |",
        "|---|---:|",
        *(f"| answered {status} | {count} |" for status, count in sorted(report.statuses.items())),
        f"| served per second | {number(report.served_per_s)} |",
        f"| p99 latency of the 200s | {number(report.p99_served_ms, 0)} ms |",
        f"| no usable answer | {report.unanswered} |",
        f"| 503/429 without Retry-After | {report.refusals_without_retry_after} |",
        f"| RSS after warm-up, min / max | {number(report.rss_mib_min)} / {number(report.rss_mib_max)} MiB "
        f"(+{share(report.rss_growth, 1)}) |",
        f"| back to full service after the load | {number(report.recovery_s, 2)} s |",
        "",
        *bullets(goals(report)),
    ]
    return "\n".join(lines) + "\n"
