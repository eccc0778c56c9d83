"""priority.md and priority.png: each class's p50, p99 and 503s under the priority load on both
subjects, what each caller was served under the fairness load, the equal classes, the dead-item
mix and the token-level mix, the goals; the chart, latency by class over the priority load, what
each of two equal classes was served, and the time to first token by class."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from batchd.bench.kit.charts import panels
from batchd.bench.kit.formatting import figure, number
from batchd.bench.kit.goals import bullets
from batchd.bench.kit.records import ran
from batchd.bench.kit.stats import median
from batchd.bench.kit.tables import table
from batchd.bench.priority.analysis import (
    Results,
    dead_medians,
    equal_medians,
    generation_medians,
    goals,
    medians,
)
from batchd.bench.priority.workload import GENERATION_QUEUE, GENERATION_ROWS, SUBJECTS

if TYPE_CHECKING:
    from matplotlib.axes import Axes

RunT = TypeVar("RunT")


def to_markdown(results: Results) -> str:
    options = results.options
    lines = [
        "# Priority and fairness",
        "",
        ran(results.meta, f"{options.repeats} interleaved repeats of {options.duration_s:g} s per load"),
        "",
        f"One replica of {results.capacity_rps:g} items/s, its queue {options.queue} items. Priority "
        f"load: {options.overload:g}x that, {options.high_share:.0%} `high`, open loops (idle: `high` "
        "alone at its rate). Medians over repeats; 503s summed.",
        "",
        *table(
            [
                "subject",
                "idle high p99 ms",
                "high p50 ms",
                "high p99 ms",
                "high 503s",
                "low p50 ms",
                "low p99 ms",
                "low 503s",
            ],
            _rows(results.priority, medians),
        ),
        "",
        f"Fairness load: two callers in one class, {options.light_clients * options.heavy_factor} and "
        f"{options.light_clients} closed-loop clients.",
        "",
    ]
    fairness_rows = []
    for subject in SUBJECTS:
        runs = results.fairness[subject]
        heavy, light = median([r.heavy_rps for r in runs]), median([r.light_rps for r in runs])
        share = light / (heavy + light) if heavy + light else float("nan")
        fairness_rows.append(
            [subject, number(heavy), number(light), f"{share:.0%}", number(median([r.jain for r in runs]), 3)]
        )
    lines += table(
        ["subject", "heavy caller req/s", "light caller req/s", "light share", "Jain's index"], fairness_rows
    )
    if results.equal:
        lines += [
            "",
            f"Equal classes: `gold` and `silver`, both at priority 5, half of {options.equal_overload:g}x "
            f"the capacity each, open loops of {options.mix_s:g} s. Served: answers 200; displaced: items "
            "whose place the other class took.",
            "",
            *table(
                [
                    "subject",
                    "gold served",
                    "silver served",
                    "more / fewer",
                    "gold p99 ms",
                    "silver p99 ms",
                    "displaced",
                ],
                _rows(results.equal, equal_medians, _equal),
            ),
        ]
    if results.dead:
        lines += [
            "",
            f"Dead-item mix: `high` from {options.dead_high_clients} closed-loop clients (every batch "
            f"full), beside `low` at {options.dead_low_share:g}x the capacity whose requests give up after "
            f"{options.dead_timeout_s * 1000:g} ms (`batchd-timeout-s`). Live refused: requests refused "
            "while their clients still waited (queue full, shed, displaced); gave up: the replica's 504s.",
            "",
            *table(
                ["subject", "high served", "high p99 ms", "low served", "low gave up", "live refused"],
                _rows(results.dead, dead_medians),
            ),
        ]
    if results.generation:
        lines += [
            "",
            f"Token-level mix: the tiny GPT-2, {GENERATION_ROWS} rows and {GENERATION_QUEUE} waiting places; "
            f"`high` streams {options.generation_high_rps:g} requests/s ({options.generation_high_tokens} "
            f"tokens each, Poisson), alone (idle) and beside the sheddable `bulk` class's "
            f"{options.generation_bulk_clients} closed-loop clients ({options.generation_bulk_tokens} tokens "
            "each): twice what the replica holds. Time to first token from when a request was due.",
            "",
            *table(
                [
                    "subject",
                    "idle high p99 ms",
                    "high p50 ms",
                    "high p99 ms",
                    "high 503s",
                    "bulk served",
                    "bulk p99 ms",
                    "bulk shed",
                ],
                _rows(results.generation, generation_medians),
            ),
        ]
    lines += ["", *bullets(goals(results))]
    lines += ["", "![latency by class over the priority load](priority.png)", ""]
    return "\n".join(lines)


def _rows(
    by_subject: Mapping[str, list[RunT]],
    figures: Callable[[list[RunT]], dict[str, float]],
    shown: Callable[[str, float], str] = lambda _, value: figure(value),
) -> list[list[str]]:
    """A table's rows: each subject measured, then its figures over its runs, in their order."""
    return [
        [subject, *(shown(name, value) for name, value in figures(by_subject[subject]).items())]
        for subject in SUBJECTS
        if by_subject.get(subject)
    ]


def _equal(name: str, value: float) -> str:
    return number(value, 2) if name == "served ratio" else figure(value)


def draw_chart(results: Results, path: Path) -> None:
    """Top: latency of each answered request against when it was due, by class, one panel per
    subject (the first repeat). Bottom: what each equal class was served, and the time to first
    token by class (p99, medians over repeats), per subject."""
    with panels(path, 2, len(SUBJECTS), (11, 8)) as (figure_, axes):
        for axis, subject in zip(axes[0], SUBJECTS, strict=True):
            run = results.priority[subject][0]
            for name, shown, colour in (("low", run.low, "tab:orange"), ("high", run.high, "tab:blue")):
                axis.scatter(shown.series_due_s, shown.series_ms, s=3, color=colour, label=name)
            axis.set_title(f"priority load: {subject}")
            axis.set_xlabel("due at (s)")
            axis.set_yscale("log")
        axes[0][0].set_ylabel("latency (ms)")
        axes[0][0].legend()
        _equal_bars(results, axes[1][0])
        _first_token_bars(results, axes[1][1])
        figure_.tight_layout()


def _equal_bars(results: Results, axis: Axes) -> None:
    subjects = [subject for subject in SUBJECTS if results.equal.get(subject)]
    for offset, (name, colour) in enumerate((("gold", "goldenrod"), ("silver", "silver"))):
        served = [median([getattr(run, name).answered for run in results.equal[s]]) for s in subjects]
        axis.bar([i + 0.4 * offset for i in range(len(subjects))], served, 0.4, color=colour, label=name)
    axis.set_xticks([i + 0.2 for i in range(len(subjects))], subjects)
    axis.set_title("equal classes (priority 5 each): answers")
    axis.set_ylabel("requests served")
    axis.legend()


def _first_token_bars(results: Results, axis: Axes) -> None:
    subjects = [subject for subject in SUBJECTS if results.generation.get(subject)]
    bars = (("idle high p99 ms", "lightsteelblue", "high, idle"), ("high p99 ms", "tab:blue", "high"),
            ("bulk p99 ms", "tab:orange", "bulk (sheddable)"))  # fmt: skip
    for offset, (key, colour, label) in enumerate(bars):
        values = [generation_medians(results.generation[s])[key] for s in subjects]
        axis.bar([i + 0.27 * offset for i in range(len(subjects))], values, 0.27, color=colour, label=label)
    axis.set_xticks([i + 0.27 for i in range(len(subjects))], subjects)
    axis.set_yscale("log")
    axis.set_title("token-level mix: time to first token, p99")
    axis.set_ylabel("ms")
    axis.legend()
