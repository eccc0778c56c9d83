"""adaptive.png: p99 against arrival rate, one panel per model, the bursty load apart."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from batchd.bench.adaptive.options import ADAPTIVE, BURSTY, load_name
from batchd.bench.adaptive.results import ModelResult, Report
from batchd.bench.kit.charts import panels

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

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
