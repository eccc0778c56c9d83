"""generation.md and generation.png: per model, a row per rate and mode, the sentence the README
quotes, and output tokens/s and p99 time to first token against the arrival rate."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from batchd.bench.generation.analysis import SATURATED, Comparison, RatePoint, Results
from batchd.bench.generation.workload import MAX_BATCH_SIZE, MODES, SHAPE
from batchd.bench.kit.charts import panels
from batchd.bench.kit.formatting import number
from batchd.bench.kit.records import ran

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


TABLE_HEAD = (
    "| rate req/s | mode | output tokens/s | offered tokens/s | TTFT p50 ms | TTFT p99 ms "
    "| end-to-end p99 ms | errors |\n|---:|---|---:|---:|---:|---:|---:|---:|"
)


def _row(point: RatePoint, mode: str) -> str:
    figures = (
        point.tokens_per_s,
        point.offered_tokens_per_s,
        point.latency.ttft_p50_ms,
        point.latency.ttft_p99_ms,
        point.latency.e2e_p99_ms,
    )
    cells = [f"{point.rate_rps:g}", mode, *(number(figure, 0) for figure in figures), str(point.errors)]
    return "| " + " | ".join(cells) + " |"


def verdict(comparison: Comparison) -> str:
    """The sentence the README quotes: the two ratios where request-level batching saturates."""
    where = comparison.request_level_saturates_at_rps
    if where is not None:
        lead = (
            f"Request-level batching saturates at {where:g} req/s (it completes under {SATURATED:.0%} of "
            "the offered tokens/s). There, token-level batching makes"
        )
    else:
        lead = (
            "Request-level batching did not saturate; at the highest rate, "
            f"{comparison.compared_at_rps:g} req/s, token-level batching makes"
        )
    best = comparison.best_tokens_per_s
    return (
        f"{lead} **{number(comparison.throughput_ratio, 2)}x** the output tokens/s, with a "
        f"**{number(comparison.ttft_p99_ratio)}x** lower p99 time to first token and a "
        f"{number(comparison.e2e_p99_ratio)}x lower p99 end-to-end latency. Best output tokens/s: "
        f"token-level {number(best['token'], 0)}, request-level {number(best['request'], 0)}."
    )


def to_markdown(results: Results) -> str:
    lines = [
        "# Text generation: token-level vs request-level batching",
        "",
        f"{ran(results.meta, 'device ' + results.device)}. "
        f"Open loop, Poisson arrivals; {SHAPE}, so both modes make the same tokens; "
        f"max_batch_size {MAX_BATCH_SIZE}; every request streamed. Medians over repeats; the modes take "
        "turns at every rate.",
        "",
    ]
    for model in results.models.values():
        lines += [
            f"## {model.title}",
            "",
            f"{model.repeats} repeat(s) of {model.duration_s:g} s of arrivals per rate; "
            f"{model.torch_threads} torch thread(s) per replica.",
            "",
            TABLE_HEAD,
        ]
        for index in range(len(model.rates_rps)):
            lines += [_row(model.medians[mode][index], mode) for mode in MODES]
        lines += ["", verdict(model.comparison), ""]
    lines.append("![throughput and p99 time to first token against arrival rate](generation.png)\n")
    return "\n".join(lines)


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
