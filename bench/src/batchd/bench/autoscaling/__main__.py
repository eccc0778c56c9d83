"""`python -m batchd.bench.autoscaling`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchd.bench import autoscaling
from batchd.bench.autoscaling.calibration import calibrate, calibration_markdown
from batchd.bench.autoscaling.chart import draw_chart
from batchd.bench.autoscaling.options import QUICK, SUBJECTS, Options
from batchd.bench.autoscaling.report import step_markdown, write_results
from batchd.bench.autoscaling.workload import run_step
from batchd.bench.kit import cli, records


def _meta(argv: Sequence[str]) -> dict[str, Any]:
    return records.run_meta("batchd.bench.autoscaling", argv)


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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    # Not every request of the emulated API server, nor every readiness check of a starting replica.
    for noisy in ("aiohttp.access", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="batchd-autoscaling-") as temporary:
        workdir = args.workdir or Path(temporary)
        if args.mode == "calibrate":
            return _calibrate_command(args, argv, workdir)
        return _step_command(args, argv, workdir)


def _step_command(args: argparse.Namespace, argv: Sequence[str], workdir: Path) -> int:
    options = cli.overridden(QUICK if args.quick else Options(), args, "repeats", "poll_s", "max_queued")
    step = asyncio.run(run_step(options, workdir))
    step["meta"] = _meta(argv)
    write_results(args.output_dir, "step", step)
    draw_chart(step, args.output_dir / "autoscaling.png")
    print(step_markdown(step))
    print(f"results: {args.output_dir / 'autoscaling.json'}, .md and .png")
    lost = {subject: step["summary"][subject]["unanswered"] for subject in SUBJECTS}
    if any(lost.values()):
        examples = [
            example
            for subject in SUBJECTS
            for run in step["runs"][subject]
            for example in run["figures"]["unanswered_examples"]
        ]
        print(f"FAILED: requests without a usable answer: {lost}; e.g. {examples[:3]}", file=sys.stderr)
        return 1
    return 0


def _calibrate_command(args: argparse.Namespace, argv: Sequence[str], workdir: Path) -> int:
    duration_s = args.duration_s or (2.0 if args.quick else 20.0)
    warmup_s = 1.0 if args.quick else 3.0
    batch_wait_s = Options().batch_wait_s
    rows = calibrate(duration_s, warmup_s, workdir, batch_wait_s)
    calibration = {
        "meta": _meta(argv),
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "batch_wait_s": batch_wait_s,
        "rows": rows,
    }
    write_results(args.output_dir, "calibration", calibration)
    print(calibration_markdown(calibration))
    errors = sum(row["errors"] for row in rows)
    if errors:
        print(f"FAILED: {errors} request(s) failed during calibration", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
