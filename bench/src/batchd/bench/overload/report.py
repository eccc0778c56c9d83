"""What the overload run promises, checked, and overload.md."""

from __future__ import annotations

from batchd.bench.kit import formatting
from batchd.bench.kit.formatting import number, share
from batchd.bench.overload.workload import Overload


def verdicts(report: Overload) -> dict[str, bool]:
    """The promises of the package docstring, as checks on a run."""
    allowed = {"200", "429", "503"}
    return {
        "only 200, or 503/429 with Retry-After": set(report.statuses) <= allowed
        and report.refusals_without_retry_after == 0
        and report.unanswered == 0,
        "resident memory flat (within 10% after warm-up)": report.rss_growth <= 0.10,
        "full service within a second of the load ending": report.recovery_s <= 1.0,
    }


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
        *(f"- {formatting.verdict(ok)}: {what}" for what, ok in verdicts(report).items()),
    ]
    return "\n".join(lines) + "\n"
