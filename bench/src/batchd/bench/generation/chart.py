"""generation.png: output tokens/s and p99 time to first token against the arrival rate."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from batchd.bench.generation.analysis import Results
from batchd.bench.generation.workload import MAX_BATCH_SIZE, MODES
from batchd.bench.kit.charts import panels

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def draw_chart(results: Results, path: Path) -> None:
    """Per model, output tokens/s (top) and p99 time to first token (bottom) against the rate."""
    models = results.models
    with panels(path, 2, len(models), (6 * len(models), 8), constrained_layout=True) as (figure, axes):
        _draw(figure, axes, results)


def _draw(figure: Figure, axes: list[list[Axes]], results: Results) -> None:
    colors = {"token": "tab:blue", "request": "tab:orange"}
    for column, model in enumerate(results.models.values()):
        throughput, ttft = axes[0][column], axes[1][column]
        for mode in MODES:
            points = model.medians[mode]
            rates = [p.rate_rps for p in points]
            label = f"{mode}-level"
            throughput.plot(rates, [p.tokens_per_s for p in points], "o-", color=colors[mode], label=label)
            ttft.plot(rates, [p.latency.ttft_p99_ms for p in points], "o-", color=colors[mode], label=label)
            for run_rate, per_rate in model.runs[mode].items():  # each repeat, faintly
                throughput.plot(
                    [float(run_rate)] * len(per_rate),
                    [r.tokens_per_s for r in per_rate],
                    ".",
                    color=colors[mode],
                    alpha=0.3,
                )
        offered = [p.offered_tokens_per_s for p in model.medians["token"]]
        throughput.plot(
            [p.rate_rps for p in model.medians["token"]], offered, ":", color="grey", label="offered"
        )
        throughput.set_title(f"{model.title}: output tokens/s")
        ttft.set_title("p99 time to first token (ms, log)")
        ttft.set_yscale("log")
        ttft.set_xlabel("arrival rate (requests/s)")
        for ax in (throughput, ttft):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    title = f"Token- vs request-level batching, max_batch_size {MAX_BATCH_SIZE}, medians of repeats"
    figure.suptitle(f"{title} ({results.meta.date})", fontsize=10)
