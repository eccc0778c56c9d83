"""tracing.md and tracing.png: each model's requests/s and CPU per request by setting (medians over
repeats, ratios to tracing off), what Jaeger stored, the span code's cost, and the goals checked."""

from __future__ import annotations

from pathlib import Path

from batchd.bench.kit.charts import panels
from batchd.bench.kit.formatting import figure, number, share
from batchd.bench.kit.goals import bullets
from batchd.bench.kit.records import ran
from batchd.bench.kit.stats import median, ratio
from batchd.bench.tracing.analysis import OFF, Results, figures, goals
from batchd.bench.tracing.options import RPS_GOALS, SAMPLING


def _throughput(results: Results) -> list[str]:
    o = results.options
    lines = [
        "## Through the router",
        "",
        f"Each setting is its own router and replica; every repeat measures each in turn (who goes "
        f"first rotates): {o['warmup_s']:g} s of warm-up, then {o['seconds']:g} s of a closed loop "
        f"({int(o['adder_clients'])} clients on the adder, {int(o['minilm_clients'])} on MiniLM). CPU per "
        "request of each process from /proc over the measured window. Medians of "
        f"{int(o['repeats'])} repeats; ratios are to tracing off in the same repeat (their median).",
        "",
        "| model | tracing | requests/s | vs off | p50 (ms) | router CPU/request (us) | vs off | "
        "replica CPU/request (us) | vs off | Jaeger CPU/request (us) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for f in figures(results):
        off = f.mode == OFF
        lines.append(
            f"| {f.model} | {f.mode} | {figure(f.rps)} | {'' if off else number(f.rps_ratio, 3)} | "
            f"{number(f.p50_ms, 2)} | {figure(f.router_cpu_us)} | "
            f"{'' if off else number(f.router_cpu_ratio, 2)} | "
            f"{figure(f.replica_cpu_us)} | {'' if off else number(f.replica_cpu_ratio, 2)} | "
            f"{'' if off else figure(f.backend_cpu_us)} |"
        )
    lines += ["", "Every round:", "", "| model | repeat | tracing | requests/s | router us | replica us |"]
    lines.append("|---|---:|---|---:|---:|---:|")
    for r in results.rounds:
        lines.append(
            f"| {r.model} | {r.repeat + 1} | {r.mode} | {figure(r.rps)} | {figure(r.router_cpu_us)} | "
            f"{figure(r.replica_cpu_us)} |"
        )
    return [*lines, ""]


def _stored(results: Results) -> list[str]:
    lines = ["## Read back from Jaeger", ""]
    for s in results.stored:
        if SAMPLING[s.mode] == 1.0:
            lines.append(
                f"- {s.model}, {s.mode}: the marker request's trace holds {s.traces} spans, of "
                f"{', '.join(s.services)}."
            )
        else:
            lines.append(
                f"- {s.model}, {s.mode}: {s.traces} traces stored of about {s.requests:,} requests sent "
                f"({share(ratio(s.traces, s.requests), 2)})."
            )
    return [*lines, ""]


def _spans(results: Results) -> list[str]:
    cost = results.spans
    if cost is None:
        return []
    return [
        "## batchd's span code against the SDK's",
        "",
        "CPU in one process (`batchd.bench.tracing.spancost`), medians of "
        f"{len(cost.sdk_request_us)} rounds: a request's two spans (its SERVER span and its batch's, "
        "linked), and one span encoded to OTLP protobuf in batches of 512.",
        "",
        "| what | OpenTelemetry SDK (us) | batchd (us) | SDK / batchd |",
        "|---|---:|---:|---:|",
        f"| a request's two spans made and ended | {number(median(cost.sdk_request_us), 1)} | "
        f"{number(median(cost.own_request_us), 1)} | "
        f"{number(ratio(median(cost.sdk_request_us), median(cost.own_request_us)), 1)} |",
        f"| one span encoded | {number(median(cost.sdk_encode_us), 1)} | "
        f"{number(median(cost.own_encode_us), 1)} | "
        f"{number(ratio(median(cost.sdk_encode_us), median(cost.own_encode_us)), 1)} |",
        "",
    ]


def to_markdown(results: Results) -> str:
    lines = [
        "# Tracing: what recording requests costs",
        "",
        ran(results.meta),
        "",
        *(_throughput(results) if results.rounds else []),
        *(_stored(results) if results.stored else []),
        *_spans(results),
        "## Goals",
        "",
        *bullets(goals(results)),
    ]
    return "\n".join(lines) + "\n"


def draw(results: Results, path: Path) -> None:
    """Requests/s (left) and CPU per request of router and replica (right), each as a ratio to
    tracing off, by model and setting; the goals as marks."""
    found = [f for f in figures(results) if f.mode != OFF]
    if not found:
        return
    with panels(path, 1, 2, (11, 4)) as (fig, axes):
        left, right = axes[0]
        labels = [f"{f.model}\n{f.mode}" for f in found]
        positions = range(len(found))
        left.bar(positions, [f.rps_ratio for f in found], color="#4c72b0")
        for n, f in enumerate(found):
            goal = RPS_GOALS.get(f.mode)
            if goal is not None:
                left.hlines(goal, n - 0.4, n + 0.4, colors="#c44e52", linestyles="dashed")
        left.set_xticks(list(positions), labels)
        left.set_ylim(0, max(1.1, *(f.rps_ratio * 1.05 for f in found if f.rps_ratio == f.rps_ratio)))
        left.set_ylabel("requests/s, ratio to tracing off")
        left.set_title("throughput (dashed: goal)")
        width = 0.4
        right.bar(
            [p - width / 2 for p in positions], [f.router_cpu_ratio for f in found], width, label="router"
        )
        right.bar(
            [p + width / 2 for p in positions], [f.replica_cpu_ratio for f in found], width, label="replica"
        )
        right.axhline(1.0, color="grey", linewidth=0.8)
        right.set_xticks(list(positions), labels)
        right.set_ylabel("CPU per request, ratio to tracing off")
        right.set_title("CPU per request")
        right.legend()
        fig.tight_layout()
