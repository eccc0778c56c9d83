"""The main scenarios' report: a table per scenario, its ceilings, memory and ratios, and the targets."""

from __future__ import annotations

from typing import Any

from batchd.bench.kit.formatting import number, share
from batchd.bench.scenarios.analysis import PointSummary, TargetCheck


def _load(point: dict[str, Any]) -> str:
    if point["mode"] == "closed":
        return f"closed, {point['concurrency']} clients"
    return f"open, {point['rate_rps']:.0f} req/s"


def _sizes(sizes: dict[str, int]) -> str:
    return " ".join(f"{label}:{count}" for label, count in sizes.items()) or "-"


def to_markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        f"Measured {meta['date']} on {meta['machine']}; command `{meta['command']}`; "
        f"{meta['repeats']} interleaved repeats of {meta['duration_s']} s per point, medians shown.",
        "",
    ]
    for scenario in result["scenarios"].values():
        lines += [f"### {scenario['title']} (max_batch_size {scenario['max_batch_size']})", ""]
        lines += [
            "| server | load | req/s | best req/s | p50 ms | p95 ms | p99 ms | errors | mean batch "
            "| batch sizes (server, all repeats) | server CPU ms/req | client CPU |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
        ]
        for point in scenario["points"]:
            s: PointSummary = point["summary"]
            lines.append(
                f"| {point['subject']} | {_load(point)} | {number(s.throughput_rps)} | "
                f"{number(s.best_throughput_rps)} | {number(s.p50_ms, 2)} | "
                f"{number(s.p95_ms, 2)} | {number(s.p99_ms, 2)} | {s.errors} | "
                f"{number(s.mean_batch_size)} | "
                f"{_sizes(s.batch_sizes)} | {number(s.server_cpu_ms_per_request, 2)} | "
                f"{share(s.client_cpu_share)} |"
            )
        lines.append("")
        ceiling = scenario.get("ceiling")
        if ceiling:
            for kind in ("raw", "replica"):
                if ceiling.get(kind):
                    parts = ", ".join(
                        f"batch {e['batch_size']}: {number(e['items_per_s'])} items/s" for e in ceiling[kind]
                    )
                    label = "transformers alone" if kind == "raw" else "replica model layer, in-process"
                    lines.append(f"- Ceiling ({label}, {ceiling['threads']} threads): {parts}")
            if ceiling.get("replica_error"):
                lines.append(f"- Ceiling via the replica's model layer failed: {ceiling['replica_error']}")
            same = scenario.get("same_work")
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
            f"{name} idle {number(info.get('idle_rss_mb'), 0)} MB / "
            f"peak {number(info.get('peak_rss_mb'), 0)} MB"
            for name, info in scenario["subjects"].items()
        )
        lines.append(f"- Resident memory: {memory}")
        for label, key in (("medians", "ratios"), ("best repeat of each side", "ratios_best")):
            if scenario.get(key):
                listed = ", ".join(f"{k.replace('_', ' ')} {number(v, 2)}" for k, v in scenario[key].items())
                lines.append(f"- Ratios, {label} (at each side's best closed-loop load): {listed}")
        lines.append("")
    lines += [
        "### Targets",
        "",
        "| target | medians | best runs | met (medians) |",
        "|---|---:|---:|---|",
    ]
    checks: list[TargetCheck] = result.get("targets", [])
    for check in checks:
        met = {True: "yes", False: "**no**", None: "not measured"}[check.met]
        lines.append(
            f"| {check.target} | {number(check.value, 2)} | {number(check.best_runs_value, 2)} | {met} |"
        )
    return "\n".join(lines) + "\n"
