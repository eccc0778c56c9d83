"""`python -m batchd.bench.autoscaling`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from batchd.bench import autoscaling
from batchd.bench.autoscaling.analysis import Calibration, Results
from batchd.bench.autoscaling.calibration import CALIBRATION_SHAPES, calibrate
from batchd.bench.autoscaling.report import draw_chart, to_markdown
from batchd.bench.autoscaling.runner import Cluster, run_step
from batchd.bench.autoscaling.workload import QUICK, SUBJECTS, Options
from batchd.bench.kit import records
from batchd.bench.kit.command import Benchmark, Flag, Run, main
from batchd.testing.kubernetes.started import benchmark_control_plane, node_with_images

STEM = "autoscaling"


def measure(run: Run[Options], cluster: Cluster | None = None) -> Results:
    """The mode asked for, over what autoscaling.json had: the two run apart and report together.
    The step runs on `cluster` when given (a test's), else on a cluster of its own."""
    before = records.read_sections(Results, run.output_dir / f"{STEM}.json")
    if run.args.mode == "calibrate":
        return Results(before.step, _calibration(run))
    if cluster is not None:
        return Results(
            asyncio.run(run_step(run.options, cluster, run.workdir, run.record)), before.calibration
        )
    with (
        benchmark_control_plane(run.workdir / "control-plane") as control_plane,
        node_with_images(control_plane, run.workdir / "node") as node,
    ):
        step = asyncio.run(run_step(run.options, Cluster(control_plane, node), run.workdir, run.record))
    return Results(step, before.calibration)


def _calibration(run: Run[Options]) -> Calibration:
    options = run.options
    shapes = CALIBRATION_SHAPES[: options.calibration_shapes]
    rows = calibrate(
        options.calibration_s, options.calibration_warmup_s, run.workdir, options.batch_wait_s, shapes
    )
    return Calibration(
        run.record, options.calibration_s, options.calibration_warmup_s, options.batch_wait_s, rows
    )


def failure(results: Results) -> str | None:
    """Requests without a usable answer, in either mode's latest figures."""
    if results.step is not None:
        lost = {subject: results.step.summary[subject]["unanswered"].value for subject in SUBJECTS}
        if any(lost.values()):
            runs = [run for runs in results.step.runs.values() for run in runs]
            examples = [example for run in runs for example in run.figures.unanswered_examples]
            return f"requests without a usable answer: {lost}; e.g. {examples[:3]}"
    errors = sum(row.errors for row in results.calibration.rows) if results.calibration else 0
    return f"{errors} request(s) failed during calibration" if errors else None


def mode_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "mode",
        nargs="?",
        choices=("step", "calibrate"),
        default="step",
        help="the load step, or the calibration",
    )


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
        "calibration_s": Flag("calibrate: seconds at each rate", above=0),
    },
    measure=measure,
    markdown=to_markdown,
    results=Results,
    chart=chart,
    failure=failure,
    extra_arguments=mode_argument,
    workdir_help="keep logs and pod folders here",
    # Not every request to the API server, nor every readiness check of a starting replica.
    quiet_loggers=("aiohttp.access", "httpx"),
)

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
