"""rollouts.md and rollouts.png: the failed requests and the p99 of each subject, the goals; the
chart, the canary's share and the error rate clients saw over time."""

from __future__ import annotations

from pathlib import Path

from batchd.bench.kit.charts import panels
from batchd.bench.kit.formatting import figure, number
from batchd.bench.kit.goals import bullets
from batchd.bench.kit.records import ran
from batchd.bench.kit.stats import median
from batchd.bench.rollouts.analysis import Results, goals
from batchd.bench.rollouts.workload import SUBJECTS


def to_markdown(results: Results) -> str:
    options = results.options
    lines = [
        "# Rollouts",
        "",
        ran(results.meta, f"{options.repeats} interleaved run(s) of the three subjects"),
        "",
        f"{options.rate:g} requests/s through the router to one replica; after {options.before_s:g} s a "
        f"new revision is shipped. Bad revisions fail {options.fail_percent}% of their items; the "
        f"canary's steps are {options.first_percent}% then 50%, {options.hold_s:g} s each, judged every "
        f"{options.interval_s:g} s. Failed requests summed over repeats, the rest medians.",
        "",
        "| subject | requests after the ship | failed | last failure (s after the ship) | p99 before (ms) "
        "| p99 during the rollout (ms) | ended |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for subject in SUBJECTS:
        runs = results.runs[subject]
        last = [run.last_failure_s for run in runs if run.last_failure_s is not None]
        still = any(run.still_failing for run in runs)
        shown = "still failing at the end" if still else (number(max(last)) if last else "-")
        lines.append(
            f"| {subject} | {sum(run.requests_after for run in runs)} | "
            f"{sum(run.failed_after for run in runs)} | {shown} | "
            f"{figure(median([run.steady_p99_ms for run in runs]))} | "
            f"{figure(median([run.rollout_p99_ms for run in runs]))} | {runs[-1].ended} |"
        )
    lines += ["", *bullets(goals(results))]
    lines += ["", "![canary share and error rate over time](rollouts.png)", ""]
    return "\n".join(lines)


def draw_chart(results: Results, path: Path) -> None:
    """Per subject (the first repeat): the error rate clients saw each second after the ship, and
    the canary's share of the requests."""
    with panels(path, 1, len(SUBJECTS), (13, 4), sharey=True) as (figure_, axes):
        for axis, subject in zip(axes[0], SUBJECTS, strict=True):
            run = results.runs[subject][0]
            axis.plot(run.seconds, [100 * rate for rate in run.error_rate], color="tab:red", label="failed %")
            if run.share_s:
                axis.step(
                    run.share_s, run.share_percent, where="post", color="tab:blue", label="canary share %"
                )
            axis.set_title(subject)
            axis.set_xlabel("seconds after the ship")
            axis.set_ylim(-2, 102)
        axes[0][0].set_ylabel("percent")
        axes[0][0].legend()
        figure_.tight_layout()
