"""The main scenarios' report: a table per scenario, its ceilings, memory and ratios, and the targets."""

from __future__ import annotations

from batchd.bench.kit.formatting import number, share
from batchd.bench.scenarios.results import BenchResult, Point


def _load(point: Point) -> str:
    if point.mode == "closed":
        return f"closed, {point.concurrency} clients"
    return f"open, {number(point.rate_rps, 0)} req/s"


def _sizes(sizes: dict[str, int]) -> str:
    return " ".join(f"{label}:{count}" for label, count in sizes.items()) or "-"


def to_markdown(result: BenchResult) -> str:
    meta = result.meta
    lines = [
        f"Measured {meta.date} on {meta.machine}; command `{meta.command}`; "
        f"{meta.repeats} interleaved repeats of {meta.duration_s} s per point, medians shown.",
        "",
    ]
    for scenario in result.scenarios.values():
        lines += [f"### {scenario.title} (max_batch_size {scenario.max_batch_size})", ""]
        lines += [
            "| server | load | req/s | best req/s | p50 ms | p95 ms | p99 ms | errors | mean batch "
            "| batch sizes (server, all repeats) | server CPU ms/req | client CPU |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
        ]
        for point in scenario.points:
            s = point.summary
            lines.append(
                f"| {point.subject} | {_load(point)} | {number(s.throughput_rps)} | "
                f"{number(s.best_throughput_rps)} | {number(s.p50_ms, 2)} | "
                f"{number(s.p95_ms, 2)} | {number(s.p99_ms, 2)} | {s.errors} | "
                f"{number(s.mean_batch_size)} | "
                f"{_sizes(s.batch_sizes)} | {number(s.server_cpu_ms_per_request, 2)} | "
                f"{share(s.client_cpu_share)} |"
            )
        lines.append("")
        ceiling = scenario.ceiling
        if ceiling:
            for label, entries in (
                ("transformers alone", ceiling.raw),
                ("replica model layer, in-process", ceiling.replica),
            ):
                if entries:
                    parts = ", ".join(
                        f"batch {e.batch_size}: {number(e.items_per_s)} items/s" for e in entries
                    )
                    lines.append(f"- Ceiling ({label}, {ceiling.threads} threads): {parts}")
            if ceiling.replica_error:
                lines.append(f"- Ceiling via the replica's model layer failed: {ceiling.replica_error}")
            same = scenario.same_work
            if same:
                verdict = (
                    "the same answer"
                    if same["all"]
                    else "DIFFERENT answers (the ratios compare different work)"
                )
                lines.append(
                    f"- Same work: the ceiling and the servers gave {verdict} for the same item ({same})"
                )
        memory = ", ".join(
            f"{name} idle {number(info.idle_rss_mb, 0)} MB / peak {number(info.peak_rss_mb, 0)} MB"
            for name, info in scenario.subjects.items()
        )
        lines.append(f"- Resident memory: {memory}")
        for label, ratios in (
            ("medians", scenario.ratios),
            ("best repeat of each side", scenario.ratios_best),
        ):
            if ratios:
                listed = ", ".join(f"{k.replace('_', ' ')} {number(v, 2)}" for k, v in ratios.items())
                lines.append(f"- Ratios, {label} (at each side's best closed-loop load): {listed}")
        lines.append("")
    lines += [
        "### Targets",
        "",
        "| target | medians | best runs | met (medians) |",
        "|---|---:|---:|---|",
    ]
    for check in result.targets:
        met = {True: "yes", False: "**no**", None: "not measured"}[check.met]
        lines.append(
            f"| {check.target} | {number(check.value, 2)} | {number(check.best_runs_value, 2)} | {met} |"
        )
    if result.failures:
        lines += [
            "",
            *(f"- **{name} failed**: {why.splitlines()[0]}" for name, why in result.failures.items()),
        ]
    return "\n".join(lines) + "\n"
