"""priority.md and priority.png: each class's p50, p99 and 503s under the priority load on both
subjects, what each caller was served under the fairness load, the goals; the chart, latency by
class over the priority load."""

from __future__ import annotations

from pathlib import Path

from batchd.bench.kit.charts import panels
from batchd.bench.kit.formatting import figure, number, verdict
from batchd.bench.kit.records import ran
from batchd.bench.kit.stats import median
from batchd.bench.priority.analysis import Results, goals, medians
from batchd.bench.priority.workload import SUBJECTS


def to_markdown(results: Results) -> str:
    options = results.options
    lines = [
        "# Priority and fairness",
        "",
        ran(results.meta, f"{options.repeats} interleaved repeats of {options.duration_s:g} s per load"),
        "",
        f"One replica of {results.capacity_rps:g} items/s. Priority load: {options.overload:g}x that, "
        f"{options.high_share:.0%} `high`, open loops (idle: `high` alone at its rate). Medians over "
        "repeats; 503s summed.",
        "",
        "| subject | idle high p99 ms | high p50 ms | high p99 ms | high 503s | low p50 ms | low p99 ms "
        "| low 503s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for subject in SUBJECTS:
        figures = medians(results.priority[subject])
        lines.append(f"| {subject} | " + " | ".join(figure(value) for value in figures.values()) + " |")
    lines += [
        "",
        f"Fairness load: two callers in one class, {options.light_clients * options.heavy_factor} and "
        f"{options.light_clients} closed-loop clients.",
        "",
        "| subject | heavy caller req/s | light caller req/s | light share | Jain's index |",
        "|---|---:|---:|---:|---:|",
    ]
    for subject in SUBJECTS:
        runs = results.fairness[subject]
        heavy, light = median([r.heavy_rps for r in runs]), median([r.light_rps for r in runs])
        share = light / (heavy + light) if heavy + light else float("nan")
        lines.append(
            f"| {subject} | {number(heavy)} | {number(light)} | {share:.0%} | "
            f"{number(median([r.jain for r in runs]), 3)} |"
        )
    lines += ["", *(f"- {verdict(met)}: {goal}" for goal, met in goals(results).items())]
    lines += ["", "![latency by class over the priority load](priority.png)", ""]
    return "\n".join(lines)


def draw_chart(results: Results, path: Path) -> None:
    """Latency of each answered request against when it was due, by class, one panel per subject
    (the first repeat)."""
    with panels(path, 1, len(SUBJECTS), (11, 4), sharey=True) as (figure_, axes):
        for axis, subject in zip(axes[0], SUBJECTS, strict=True):
            run = results.priority[subject][0]
            for name, shown, colour in (("low", run.low, "tab:orange"), ("high", run.high, "tab:blue")):
                axis.scatter(shown.series_due_s, shown.series_ms, s=3, color=colour, label=name)
            axis.set_title(subject)
            axis.set_xlabel("due at (s)")
            axis.set_yscale("log")
        axes[0][0].set_ylabel("latency (ms)")
        axes[0][0].legend()
        figure_.tight_layout()
