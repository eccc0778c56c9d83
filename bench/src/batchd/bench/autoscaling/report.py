"""autoscaling.md and autoscaling.png: the load step's figures for both subjects; the chart, load,
replicas, queue and windowed p99 on one time axis, both subjects."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from batchd.bench.autoscaling.analysis import AUTOSCALING_ONLY, FIGURES, Results, StepResult, SubjectRun
from batchd.bench.autoscaling.workload import SUBJECTS
from batchd.bench.kit.charts import panels
from batchd.bench.kit.formatting import figure, with_unit
from batchd.bench.kit.records import ran
from batchd.bench.kit.stats import median

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _figure(value: float | None, unit: str = "") -> str:
    """A figure as the report prints it; None is a time that never came."""
    return "never" if value is None else with_unit(figure(value), unit)


def step_markdown(step: StepResult) -> str:
    o = step.options
    s = o.step
    lines = [
        "## Load step: autoscaled vs one fixed replica",
        "",
        f"Handler: SlowAdder, {o.batch_s} s per batch of up to {o.max_batch_size} "
        f"(one replica serves at most {o.capacity_rps:.0f} items/s), batch wait {o.batch_wait_s} s, "
        f"max_queued_requests {o.max_queued}. Traffic (open loop, one item per request): "
        f"{s.low_rps:g} req/s for {s.before_s:g} s, {s.high_rps:g} req/s "
        f"({s.high_rps / o.capacity_rps:.1f}x one replica) for {s.step_s:g} s, "
        f"{s.low_rps:g} req/s for {s.after_s:g} s. Autoscaled: min {o.min_replicas}, "
        f"max {o.max_replicas}, target_ongoing_items {o.target_ongoing_items} (the default), "
        f"upscale_delay_s {o.upscale_delay_s:g}, downscale_delay_s {o.downscale_delay_s:g}; "
        f"the operator polls every {o.poll_s:g} s (its default is 5 s); preStop sleep "
        f"{o.drain_delay_s} s. Medians of {o.repeats} interleaved repeats (each repeat's "
        "values in brackets).",
        "",
        f"Definitions: *p99* counts requests answered 200, by the moment they were sent (503s are "
        f"answered at once and counted apart). *load carried*: the first moment after which the p99 "
        f"over a sliding {o.window_s:g} s window stays under {o.carry_factor:g}x the p99 "
        f"before the step until the step ends (samples every {o.sample_s:g} s). *ready capacity >= "
        f"offered*: ready replicas x {o.capacity_rps:.0f} items/s >= {s.high_rps:g} req/s. "
        f"*queue under target*: the first moment after which the total queue stays at or under "
        f"{o.target_ongoing_items} items per ready replica until the step ends. "
        "*never*: not before the step ended. "
        "*Without a usable answer*: neither a 2xx nor a 503 with Retry-After (must be 0).",
        "",
        "| figure | autoscaled | fixed (1 replica) |",
        "|---|---:|---:|",
    ]
    for key, label, unit in FIGURES:
        cells = []
        for subject in SUBJECTS:
            if subject == "fixed" and key in AUTOSCALING_ONLY:
                cells.append("n/a")
                continue
            median = step.summary[subject][key]
            text = _figure(median.value, unit)
            if len(median.runs) > 1:
                text += " (" + ", ".join(_figure(v) for v in median.runs) + ")"
            cells.append(text)
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def to_markdown(results: Results) -> str:
    parts = ["# Autoscaling benchmark\n"]
    if results.step is not None:
        parts += [
            ran(results.step.meta) + "\n",
            step_markdown(results.step),
            "![load step](autoscaling.png)\n",
        ]
    return "\n".join(parts)


COLORS = {"autoscaled": "tab:blue", "fixed": "tab:orange"}


def _median_series(runs: Sequence[SubjectRun], key: str) -> tuple[list[float], list[float]]:
    """Sample by sample (the samples of every run share the grid), the median over repeats."""
    length = min(len(run.series["t"]) for run in runs)
    times = [median([run.series["t"][i] for run in runs]) for i in range(length)]
    values = [median([run.series[key][i] for run in runs]) for i in range(length)]
    return times, values


def draw_chart(step: StepResult, path: Path) -> None:
    """Four panels on one time axis: load, replicas, queue, windowed p99; both subjects on each."""
    with panels(path, 4, 1, (10, 11), sharex=True, constrained_layout=True) as (figure, grid):
        _draw(figure, [row[0] for row in grid], step)


def _draw(figure: Figure, axes: list[Axes], step: StepResult) -> None:
    options = step.options
    shape = options.step
    load_ax, replicas_ax, queue_ax, p99_ax = axes
    for subject in SUBJECTS:
        runs = step.runs[subject]
        color = COLORS[subject]
        label = "autoscaled (1-6)" if subject == "autoscaled" else "fixed (1 replica)"
        for key, ax, style, what in (
            ("ok_rps", load_ax, "-", "answered 200/s"),
            ("ready", replicas_ax, "-", "ready"),
            ("desired", replicas_ax, "--", "desired"),
            ("queued", queue_ax, "-", None),
            ("p99_ms", p99_ax, "-", None),
        ):
            for run in runs:  # each repeat faintly, the median boldly
                ax.plot(run.series["t"], run.series[key], style, color=color, alpha=0.2, lw=0.8)
            times, values = _median_series(runs, key)
            ax.plot(times, values, style, color=color, lw=1.8, label=f"{label}: {what}" if what else label)
    times, offered = _median_series(step.runs["autoscaled"], "offered_rps")
    load_ax.plot(times, offered, color="black", lw=1.2, label="offered (both)")
    load_ax.axhline(options.capacity_rps, color="grey", ls=":", lw=1)
    load_ax.annotate("one replica's capacity", (1, options.capacity_rps), color="grey", fontsize=8)
    idle = [value for s in SUBJECTS if (value := step.summary[s]["idle_p99_ms"].value)]
    if idle:
        threshold = options.carry_factor * median(idle)
        p99_ax.axhline(threshold, color="grey", ls=":", lw=1)
        p99_ax.annotate(
            f"{options.carry_factor:g}x idle p99 ('carried')",
            (1, threshold * 1.1),
            color="grey",
            fontsize=8,
        )
    load_ax.set_ylabel("requests/s")
    load_ax.set_title("load")
    replicas_ax.set_ylabel("replicas")
    replicas_ax.set_title("replicas (solid: ready, dashed: desired)")
    queue_ax.set_ylabel("items queued")
    queue_ax.set_yscale("symlog", linthresh=10)
    queue_ax.set_ylim(bottom=0)
    queue_ax.set_title("total queue depth (sum of ready replicas' /load queued_items)")
    p99_ax.set_ylabel("ms")
    p99_ax.set_yscale("log")
    p99_ax.set_title(f"p99 latency of 200s, sliding {options.window_s:g} s window, by send time")
    p99_ax.set_xlabel("seconds since the traffic started")
    for ax in axes:
        ax.axvspan(shape.before_s, shape.before_s + shape.step_s, color="grey", alpha=0.08)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    figure.suptitle(
        f"Load step {shape.low_rps:g} -> {shape.high_rps:g} -> {shape.low_rps:g} req/s "
        f"(shaded), SlowAdder {options.max_batch_size} items / {options.batch_s} s; "
        f"medians of {options.repeats} repeats (faint: each repeat)",
        fontsize=10,
    )
