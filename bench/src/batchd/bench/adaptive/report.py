"""adaptive.md and adaptive.png: per model, the p99 and throughput of every subject at every load
and the verdicts; the chart, p99 against arrival rate, one panel per model, the bursty load apart."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from batchd.bench.adaptive.analysis import ModelResult, Report
from batchd.bench.adaptive.workload import (
    ADAPTIVE,
    BURSTY,
    SHARED_DEVICE,
    SLOTS,
    is_cost_curve,
    load_name,
    window_subject,
)
from batchd.bench.kit.charts import panels
from batchd.bench.kit.formatting import figure, number, share
from batchd.bench.kit.goals import bullets
from batchd.bench.kit.records import ran
from batchd.bench.kit.tables import table

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def model_markdown(result: ModelResult) -> str:
    options = result.options
    meta = result.meta
    summary, verdict = result.summary, result.verdicts
    subjects = options.subjects
    model = result.model
    capacity = result.capacity_rps
    if is_cost_curve(model):
        what = (
            f"`CostCurve` ({options.alpha_s * 1000:g} ms + {options.beta_s * 1000:g} ms per item, "
            f"max_batch_size {options.max_batch_size}, max_concurrent_batches {SLOTS.get(model, 1)}"
            f"{' sharing one device' if model == SHARED_DEVICE else ''}): "
            f"capacity measured {capacity:.0f} items/s "
            f"(the curve says {number(result.curve_capacity_rps, 0)})"
        )
    else:
        what = f"MiniLM-L6, CPU, max_batch_size {options.max_batch_size}: capacity measured {capacity:.0f} "
        what += "items/s"
    lines = [
        f"## {result.title}",
        "",
        ran(
            meta,
            f"{meta.minutes:g} min",
            f"load average {meta.load_average_before:.1f} before, {meta.load_average_after:.1f} after: "
            "the machine is shared",
        )
        + ".",
        "",
        f"{what} (closed loop, {options.capacity_clients} clients, 0 ms window; runs: "
        + ", ".join(f"{v:.0f}" for v in result.capacity_runs_rps)
        + f"). Adaptive objective: {result.objective_s * 1000:.0f} ms "
        f"({options.objective_factor:g} x a full batch at capacity).",
        "",
        "p99 latency (ms) / throughput (req/s), medians of "
        f"{options.repeats} repeat(s); the best fixed window's p99 at each load in bold.",
        "",
    ]
    rows = []
    for load in options.loads:
        v = verdict.per_load[load]
        offered = (
            f"{options.burst_fraction * capacity:.0f} on / 0 off"
            if load == BURSTY
            else f"{float(load.removesuffix('%')) / 100 * capacity:.0f}"
        )
        cells = []
        for subject in subjects:
            figures = summary[subject][load]
            p99 = figure(figures.p99_ms)
            if subject == v.best_fixed_p99:
                p99 = f"**{p99}**"
            cells.append(f"{p99} / {number(figures.throughput_rps, 0)}")
        against = (
            f"{number(v.p99_ratio, 2)} ({'met' if v.p99_met else 'NOT met'}), "
            f"{number(v.throughput_ratio, 3)} ({'met' if v.throughput_met else 'NOT met'})"
        )
        rows.append([load, offered, *cells, against])
    head = ["load", "offered req/s", *subjects, "adaptive vs best fixed: p99, throughput"]
    lines += table(head, rows, align="lr" + "r" * len(subjects) + "l")
    mix = verdict.mix_score
    lines += [
        "",
        "On the mix (mean over the five loads of p99 / the best p99 at that load; 1.00 = best everywhere): "
        + ", ".join(
            f"{s} **{number(mix[s], 2)}**" if s == ADAPTIVE else f"{s} {number(mix[s], 2)}" for s in subjects
        )
        + ". Sum of the p99s: "
        + ", ".join(f"{s} {number(verdict.p99_sum_ms[s], 0)} ms" for s in subjects)
        + ".",
        "",
        *bullets(verdict.goals),
        "",
        "What the replicas did (medians): mean batch size formed, and for the adaptive replica the "
        "batch size it planned (median of the samples), its mean wait, and the share of items over "
        "the objective.",
        "",
    ]
    zero = window_subject(0.0)
    rows = []
    for load in options.loads:
        a = summary[ADAPTIVE][load]
        zero_wait = figure(summary[zero][load].mean_wait_ms) if zero in summary else "-"
        batches = [number(summary[s][load].mean_batch_size) for s in subjects]
        planned = number(a.planned_batch_size_median, 0)
        rows.append(
            [load, *batches, planned, figure(a.mean_wait_ms), zero_wait, share(a.objective_missed_share, 1)]
        )
    head = ["load", *(f"{s} batch" for s in subjects), "adaptive planned", "adaptive wait ms", "0 ms wait ms"]
    lines += table([*head, "over objective"], rows)
    fits = [
        (
            summary[ADAPTIVE][load].cost_fixed_ms,
            summary[ADAPTIVE][load].cost_per_item_ms,
        )
        for load in options.loads
    ]
    truth = (
        f" (the truth: {options.alpha_s * 1000:g} + {options.beta_s * 1000:g} ms per item)"
        if is_cost_curve(model)
        else ""
    )
    lines += [
        "",
        "Learned cost line at the end of each load (fixed ms + ms per item): "
        + ", ".join(
            f"{load} {number(a)} + {number(b, 2)}" for load, (a, b) in zip(options.loads, fits, strict=True)
        )
        + truth
        + ".",
    ]
    adapt = result.adaptivity
    lines += [
        "",
        f"Adapting (bursty runs, /metrics every {options.sample_s:g} s, median over "
        f"{adapt.bursts} bursts): the adaptive replica's arrival-rate estimate reached 63% of the "
        f"burst's rate {number(adapt.rate_estimate_63pct_s)} s after each burst began, the batches it "
        f"formed reached 90% of the burst's largest within {number(adapt.batch_size_90pct_s)} s, "
        f"and its last batch of the burst's backlog ran {number(adapt.backlog_served_after_burst_s)} s "
        "after the burst ended "
        "(time series: `runs.adaptive.bursty[*].series` in adaptive.json).",
    ]
    return "\n".join(lines) + "\n"


def to_markdown(report: Report) -> str:
    options = next(iter(report.models.values())).options
    parts = [
        "# Adaptive batching benchmark",
        "",
        "Five replicas per model (one batch at a time, but for the two slots of "
        f"`{SHARED_DEVICE}`), max_batch_size {options.max_batch_size}: fixed windows "
        + ", ".join(window_subject(ms) for ms in options.windows_ms)
        + " and adaptive (`latency_objective_s`). Open loops, "
        f"{options.arrivals} arrivals (the same arrival times for every subject of a repeat), at "
        + ", ".join(load_name(f) for f in options.fractions)
        + f" of the measured capacity for {options.duration_s:g} s"
        + (f" or {options.min_requests} requests, whichever is longer," if options.min_requests else "")
        + f" after {options.warmup_s:g} s of warm-up at the same rate; bursty: "
        f"{options.burst_fraction:.0%} of capacity for {options.burst_on_s:g} s, then "
        f"{options.burst_off_s:g} s idle, {options.burst_cycles} times. Latency from when each request "
        "was due. Subjects take turns within each repeat, in a rotating order. "
        "See `batchd/bench/adaptive/__init__.py` for the definitions.",
        "",
    ]
    for result in report.models.values():
        parts.append(model_markdown(result))
    parts.append("![p99 against arrival rate](adaptive.png)\n")
    return "\n".join(parts)


STYLES: dict[str, tuple[str, str]] = {
    "0 ms": ("tab:blue", "o"),
    "2 ms": ("tab:green", "s"),
    "10 ms": ("tab:purple", "^"),
    "50 ms": ("tab:orange", "v"),
    ADAPTIVE: ("black", "D"),
}


def label(subject: str, result: ModelResult) -> str:
    if subject == ADAPTIVE:
        return f"adaptive ({result.objective_s * 1000:.0f} ms objective)"
    return subject


def draw_chart(report: Report, path: Path) -> None:
    """p99 against arrival rate (fraction of capacity), one panel per model; the bursty load apart."""
    results = list(report.models.values())
    with panels(path, 1, len(results), (6.4 * len(results), 5.6)) as (figure, axes):
        _draw(figure, axes[0], results)
        figure.tight_layout()


def _draw(figure: Figure, axes: list[Axes], results: list[ModelResult]) -> None:
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, ScalarFormatter

    options = results[0].options
    burst_x = options.burst_fraction
    spread = 0.018  # the bursty markers side by side, not on top of each other
    for ax, result in zip(axes, results, strict=True):
        summary = result.summary
        options = result.options
        values: list[float] = []
        for index, subject in enumerate(options.subjects):
            color, marker = STYLES.get(subject, ("tab:gray", "x"))
            bold = subject == ADAPTIVE
            p99 = [summary[subject][load_name(f)].p99_ms for f in options.fractions]
            burst_p99 = summary[subject][BURSTY].p99_ms
            values += [*p99, burst_p99]
            ax.plot(
                options.fractions, p99, marker=marker, color=color, lw=2.4 if bold else 1.3,
                ms=7 if bold else 5, label=label(subject, result), zorder=3 if bold else 2,
            )  # fmt: skip
            offset = (index - (len(options.subjects) - 1) / 2) * spread
            ax.plot(
                [burst_x + offset], [burst_p99], marker=marker, color=color,
                ms=8 if bold else 6, ls="none", mfc="none" if not bold else color, mew=1.6,
            )  # fmt: skip
        ax.axvline((max(options.fractions) + burst_x) / 2, color="grey", lw=0.8, ls=":")
        objective_ms = result.objective_s * 1000
        ax.axhline(objective_ms, color="black", lw=0.8, ls="--", alpha=0.5)
        ax.annotate(
            "adaptive's objective", (options.fractions[0], objective_ms * 1.03), fontsize=8, color="dimgray"
        )
        ax.set_yscale("log")
        finite = [v for v in values if not math.isnan(v)] or [1.0]
        low, high = min(finite) / 1.25, max(max(finite), objective_ms) * 1.25
        ax.set_ylim(low, high)
        ticks = [t * 10**e for e in range(0, 5) for t in (1, 2, 3, 5) if low <= t * 10**e <= high]
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(0, burst_x + 0.1)
        ax.set_xticks([*options.fractions, burst_x])
        ax.set_xticklabels([f"{f:.0%}" for f in options.fractions] + [f"bursty\n(on/off at {burst_x:.0%})"])
        ax.set_xlabel(f"open-loop arrival rate, of the measured capacity ({result.capacity_rps:.0f} req/s)")
        ax.set_ylabel("p99 latency, ms (log scale)")
        ax.set_title(result.title, fontsize=11)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title="batch window", title_fontsize=8, loc="upper left")
    figure.suptitle(
        "p99 latency against arrival rate: fixed batch windows vs adaptive batching\n"
        f"(one replica each, max_batch_size {options.max_batch_size}; medians of {options.repeats} "
        "interleaved repeat(s))",
        fontsize=10,
    )
