"""`python -m batchd.bench.autoscaling`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from batchd.bench import autoscaling
from batchd.bench.autoscaling.calibration import CALIBRATION_SHAPES, calibrate, calibration_markdown
from batchd.bench.autoscaling.chart import draw_chart
from batchd.bench.autoscaling.options import QUICK, SUBJECTS, Options
from batchd.bench.autoscaling.report import step_markdown, write_results
from batchd.bench.autoscaling.results import Calibration, Results
from batchd.bench.autoscaling.workload import Cluster, run_step
from batchd.bench.kit import cli
from batchd.bench.kit.records import RunRecord
from batchd.testing.kubernetes.started import benchmark_control_plane, node_with_images


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = cli.parser("batchd.bench.autoscaling", autoscaling.__doc__)
    parser.add_argument("mode", nargs="?", choices=("step", "calibrate"), default="step")
    parser.add_argument("--quick", action="store_true", help="smoke-sized: short phases, one repeat")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3)")
    parser.add_argument("--poll-s", type=float, default=None, help="the operator's poll interval (0.5)")
    parser.add_argument(
        "--max-queued", type=int, default=None, help="both subjects' max_queued_requests (the default 1024)"
    )
    parser.add_argument("--duration-s", type=float, default=None, help="calibrate: seconds per rate (20)")
    cli.add_output(parser, workdir_help="keep logs and pod folders here")
    args = parser.parse_args(argv)
    cli.refuse_below_one(parser, args, "repeats", "max_queued")
    return args


def main(argv: Sequence[str] | None = None, cluster: Cluster | None = None) -> int:
    """The command; the step runs on `cluster` when given (a test's), else on a cluster of its own."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    # Not every request to the API server, nor every readiness check of a starting replica.
    for noisy in ("aiohttp.access", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="batchd-autoscaling-") as temporary:
        workdir = args.workdir or Path(temporary)
        if args.mode == "calibrate":
            return _calibrate_command(args, argv, workdir)
        if cluster is not None:
            return _step_command(args, argv, cluster, workdir)
        with (
            benchmark_control_plane(workdir / "control-plane") as control_plane,
            node_with_images(control_plane, workdir / "node") as node,
        ):
            return _step_command(args, argv, Cluster(control_plane, node), workdir)


def _step_command(args: argparse.Namespace, argv: Sequence[str], cluster: Cluster, workdir: Path) -> int:
    options = cli.overridden(QUICK if args.quick else Options(), args, "repeats", "poll_s", "max_queued")
    step = asyncio.run(run_step(options, cluster, workdir, RunRecord.now("batchd.bench.autoscaling", argv)))
    write_results(args.output_dir, Results(step=step))
    draw_chart(step, args.output_dir / "autoscaling.png")
    print(step_markdown(step))
    print(f"results: {args.output_dir / 'autoscaling.json'}, .md and .png")
    lost = {subject: step.summary[subject]["unanswered"].value for subject in SUBJECTS}
    examples = [
        example for runs in step.runs.values() for run in runs for example in run.figures.unanswered_examples
    ]
    failure = f"requests without a usable answer: {lost}; e.g. {examples[:3]}" if any(lost.values()) else None
    return cli.exit_status(failure)


def _calibrate_command(args: argparse.Namespace, argv: Sequence[str], workdir: Path) -> int:
    duration_s = args.duration_s or (2.0 if args.quick else 20.0)
    warmup_s = 1.0 if args.quick else 3.0
    batch_wait_s = Options().batch_wait_s
    # Smoke size measures the first shape only: it runs every step of the calibration once.
    shapes = CALIBRATION_SHAPES[:1] if args.quick else CALIBRATION_SHAPES
    rows = calibrate(duration_s, warmup_s, workdir, batch_wait_s, shapes)
    record = RunRecord.now("batchd.bench.autoscaling", argv)
    calibration = Calibration(record, duration_s, warmup_s, batch_wait_s, rows)
    write_results(args.output_dir, Results(calibration=calibration))
    print(calibration_markdown(calibration))
    errors = sum(row.errors for row in rows)
    return cli.exit_status(f"{errors} request(s) failed during calibration" if errors else None)


if __name__ == "__main__":
    sys.exit(main())
