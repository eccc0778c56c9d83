"""peers.png: req/s and server CPU per request for each peer, one column of panels per model; a
bar is the median over repeats (its value printed above it), its whisker the lowest and highest
repeat; a panel whose bars span more than LOG_SCALE_FROM times is drawn on a log scale."""

from __future__ import annotations

from pathlib import Path

from batchd.bench.kit.charts import panels
from batchd.bench.kit.formatting import figure, number
from batchd.bench.kit.stats import median
from batchd.bench.peers import analysis
from batchd.bench.peers.catalog import MODELS, PEERS
from batchd.bench.peers.results import Results

PANELS = (
    ("rps", "requests/s (higher is better)"),
    ("cpu_ms_per_request", "server CPU ms per request (lower is better)"),
)


# Past this ratio between the highest and the lowest bar of a panel, its scale is logarithmic.
LOG_SCALE_FROM = 20


def _label(value: float) -> str:
    """Two significant figures at least: 0.049 ms, 6.1 ms, 4,808 req/s."""
    return number(value, 3) if value < 1 else figure(value)


def draw(results: Results, path: Path) -> None:
    models = list(results.options["models"])
    with panels(path, len(PANELS), len(models), (4.8 * len(models) + 1, 7.5), constrained_layout=True) as (
        canvas,
        grid,
    ):
        for column, model in enumerate(models):
            names = [info.name for info in results.peers if model in PEERS[info.name].models]
            for row, (name, label) in enumerate(PANELS):
                ax = grid[row][column]
                shown: list[float] = []
                for index, peer in enumerate(names):
                    spread = analysis.spread(results.runs, model, peer, name)
                    if not spread.values:
                        ax.annotate("n/a", (index, 0), ha="center", va="bottom", fontsize=8, color="grey")
                        continue
                    middle = median(spread.values)
                    reference = PEERS[peer].reference  # the floor: a bound, drawn apart
                    color = "C0" if peer == "batchd" else "white" if reference else "C7"
                    ax.bar(index, middle, color=color, edgecolor="C7", hatch="//" if reference else None)
                    ax.vlines(index, spread.low, spread.high, color="black", lw=1)
                    ax.annotate(_label(middle), (index, spread.high), ha="center", va="bottom", fontsize=7)
                    shown.append(middle)
                ax.set_xticks(
                    range(len(names)), [PEERS[peer].title for peer in names], rotation=30, fontsize=8
                )
                ax.set_ylabel(label, fontsize=8)
                if shown and min(shown) > 0 and max(shown) / min(shown) > LOG_SCALE_FROM:
                    ax.set_yscale("log")  # else the slowest peers' bars would not show
                ax.grid(axis="y", alpha=0.3)
                if row == 0:
                    ax.set_title(f"{MODELS[model].title}, {MODELS[model].clients} clients", fontsize=10)
        canvas.suptitle(
            "Peers on the same models and load (bar: median of repeats; line: lowest to highest)", fontsize=10
        )
