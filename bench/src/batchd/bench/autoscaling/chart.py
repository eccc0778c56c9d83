"""autoscaling.png: load, replicas, queue and windowed p99 on one time axis, both subjects."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from batchd.bench.autoscaling.options import SUBJECTS
from batchd.bench.autoscaling.results import StepResult, SubjectRun
from batchd.bench.kit.charts import panels
from batchd.bench.kit.stats import median

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

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
