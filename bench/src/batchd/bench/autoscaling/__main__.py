"""`python -m batchd.bench.autoscaling`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from batchd.bench import autoscaling
from batchd.bench.autoscaling.analysis import Results
from batchd.bench.autoscaling.report import draw_chart, to_markdown
from batchd.bench.autoscaling.runner import run_step
from batchd.bench.autoscaling.workload import QUICK, SUBJECTS, Options
from batchd.bench.kit.command import Benchmark, Flag, Run, main
from batchd.testing.kubernetes.started import Cluster, benchmark_cluster

STEM = "autoscaling"


def measure(run: Run[Options], cluster: Cluster | None = None) -> Results:
    """The load step, on `cluster` when given (a test's), else on a cluster of its own."""
    if cluster is not None:
        return Results(asyncio.run(run_step(run.options, cluster, run.workdir, run.record)))
    with benchmark_cluster(run.workdir) as own:
        return Results(asyncio.run(run_step(run.options, own, run.workdir, run.record)))


def failure(results: Results) -> str | None:
    """Requests without a usable answer."""
    if results.step is None:
        return None
    lost = {subject: results.step.summary[subject]["unanswered"].value for subject in SUBJECTS}
    if not any(lost.values()):
        return None
    runs = [run for runs in results.step.runs.values() for run in runs]
    examples = [example for run in runs for example in run.figures.unanswered_examples]
    return f"requests without a usable answer: {lost}; e.g. {examples[:3]}"


def chart(results: Results, path: Path) -> None:
    if results.step is not None:
        draw_chart(results.step, path)


BENCHMARK = Benchmark(
    module="batchd.bench.autoscaling",
    doc=autoscaling.__doc__,
    stem=STEM,
    defaults=Options(),
    quick=QUICK,
    flags={
        "repeats": Flag("interleaved repeats", minimum=1),
        "poll_s": Flag("the operator's poll interval", above=0),
        "max_queued": Flag("both subjects' max_queued_requests", minimum=1),
    },
    measure=measure,
    markdown=to_markdown,
    results=Results,
    chart=chart,
    failure=failure,
    workdir_help="keep logs and pod folders here",
    # Not every request to the API server, nor every readiness check of a starting replica.
    quiet_loggers=("aiohttp.access", "httpx"),
)

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
