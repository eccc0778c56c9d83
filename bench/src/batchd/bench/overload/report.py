"""What the overload run promises, checked, and overload.md."""

from __future__ import annotations

from typing import Any

from batchd.bench.kit import formatting


def verdicts(report: dict[str, Any]) -> dict[str, bool]:
    """The promises of the module docstring, as checks on a report."""
    allowed = {"200", "429", "503"}
    return {
        "only 200, or 503/429 with Retry-After": set(report["statuses"]) <= allowed
        and report["refusals_without_retry_after"] == 0
        and report["unanswered"] == 0,
        "resident memory flat (within 10% after warm-up)": report["rss_growth"] <= 0.10,
        "full service within a second of the load ending": report["recovery_s"] <= 1.0,
    }


def markdown(report: dict[str, Any]) -> str:
    offered, capacity = report["offered_rate_per_s"], report["capacity_items_per_s"]
    lines = [
        f"Open loop at {offered:.0f} req/s ({offered / capacity:.0f}x capacity, {capacity:.0f} items/s) "
        f"for {report['duration_s']:.0f} s: {report['requests']} requests.",
        "",
        "| measure | value |",
        "|---|---:|",
        *(f"| answered {status} | {count} |" for status, count in sorted(report["statuses"].items())),
        f"| served per second | {report['served_per_s']:.1f} |",
        f"| p99 latency of the 200s | {report['p99_served_ms']:.0f} ms |",
        f"| no usable answer | {report['unanswered']} |",
        f"| 503/429 without Retry-After | {report['refusals_without_retry_after']} |",
        f"| RSS after warm-up, min / max | {report['rss_mib_min']:.1f} / {report['rss_mib_max']:.1f} MiB "
        f"(+{report['rss_growth'] * 100:.1f}%) |",
        f"| back to full service after the load | {report['recovery_s']:.2f} s |",
        "",
        *(f"- {formatting.verdict(ok)}: {what}" for what, ok in verdicts(report).items()),
    ]
    return "\n".join(lines) + "\n"
