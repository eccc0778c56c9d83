"""The operator benchmark's report: the lines it prints and operator.md."""

from __future__ import annotations

from batchd.bench.kit.records import ran
from batchd.bench.operator_bench.results import OperatorResult


def report_lines(result: OperatorResult) -> list[str]:
    figures, repeats, resources = (
        result.convergence,
        result.convergence.repeats,
        result.convergence.bulk_resources,
    )
    lines = [
        f"create -> Deployment: median {figures.create_to_deployment_median_ms:.1f} ms, "
        f"p90 {figures.create_to_deployment_p90_ms:.1f} ms over {repeats} creates",
        f"{resources} resources: created in {figures.bulk_create_s:.1f} s, all converged "
        f"(children + status) after {figures.bulk_converge_s:.1f} s "
        f"({figures.bulk_per_second:.1f} resources/s; the operator used "
        f"{figures.bulk_operator_cpu_s:.1f} s of CPU in that time)",
        f"operator RSS: {figures.operator_rss_idle_peak_mib:.0f} MiB idle, "
        f"{figures.operator_rss_after_bulk_mib:.0f} MiB with {resources + repeats} resources "
        f"(peak {figures.operator_rss_peak_mib:.0f} MiB)",
    ]
    auto = result.autoscaling
    if auto:
        cores = ", ".join(f"{w.operator_cores:.3f}" for w in auto.windows)
        lines += [
            f"autoscaling {auto.resources} resources x {auto.replicas // max(auto.resources, 1)} "
            f"replicas ({auto.replicas} stand-in /load endpoints, one lightweight process: the "
            f"figures are the operator's own cost), polled every {auto.poll_interval_s:g} s, "
            f"{auto.steady_s:.0f} s of steady state:",
            f"  operator CPU: {auto.operator_cores_median:.3f} cores (median of {len(auto.windows)} "
            f"windows: {cores}; mean {auto.operator_cores_mean:.3f}); the stand-in endpoints used "
            f"{auto.load_endpoints_cores_median:.3f} cores",
            f"  operator RSS: {auto.operator_rss_mib:.0f} MiB (peak {auto.operator_rss_peak_mib:.0f} MiB)",
            f"  polls: {auto.polls_per_s:.1f}/s (expected {auto.expected_polls_per_s:.1f}/s); "
            f"{auto.replicas_polled} of {auto.replicas} replicas polled, "
            f"{auto.polls_per_replica_min}-{auto.polls_per_replica_max} times each "
            f"(expected {auto.expected_polls_per_replica:.1f})",
            f"  one round of polls spans {auto.round_spread_ms_median:.0f} ms (median of "
            f"{auto.rounds} rounds), rounds start every {auto.round_period_s_median:.2f} s",
            f"  status writes: {auto.status_writes} ({auto.status_writes_per_s:.1f}/s); "
            f"operator API calls in steady state: {auto.operator_calls}",
        ]
    return lines


def to_markdown(result: OperatorResult) -> str:
    lines = [
        "# Operator benchmark",
        "",
        ran(result.meta),
        "",
        "The operator in its own process (`python -m batchd.operator`) against a real API server,"
        " with no node.",
        "",
        *(f"  - {line.strip()}" if line.startswith("  ") else f"- {line}" for line in report_lines(result)),
    ]
    auto = result.autoscaling
    if auto:
        lines += [
            "",
            "Autoscaling steady state, window by window:",
            "",
            "| window | operator cores | polls/s | replicas polled | status writes | watches restarted "
            "| stand-in endpoints cores |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for index, window in enumerate(auto.windows, 1):
            lines.append(
                f"| {index} ({window.end - window.start:.1f} s) | {window.operator_cores:.3f} "
                f"| {window.polls_per_s:.1f} | {window.replicas_polled} | {window.status_writes} "
                f"| {window.watch_restarts} | {window.load_endpoints_cores:.3f} |"
            )
    return "\n".join(lines) + "\n"
