"""`python -m batchd.bench.overhead`: the command (what it measures: the package's docstring)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from batchd.bench import overhead
from batchd.bench.kit import cli
from batchd.bench.kit.records import run_meta
from batchd.bench.overhead import analysis, subjects, workload
from batchd.bench.overhead.report import to_markdown, write_results
from batchd.bench.overhead.results import Results

MODULE = "batchd.bench.overhead"


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, workload.Options]:
    parser = cli.parser(MODULE, overhead.__doc__)
    parser.add_argument("--repeats", type=int, default=None, help="rounds of every subject (5)")
    parser.add_argument("--clients", type=int, default=None, help="closed-loop clients (128)")
    parser.add_argument("--duration-s", type=float, default=None, help="measured seconds per run (5)")
    parser.add_argument(
        "--subjects",
        nargs="+",
        default=None,
        help="some of batchd, baseline, bare, mosec, minimal (default: batchd bare, "
        "mosec when its python is known, baseline when its source is given)",
    )
    parser.add_argument(
        "--baseline-src", type=Path, default=None, help="a replica source tree to compare with"
    )
    parser.add_argument(
        "--mosec-python",
        type=Path,
        default=None,
        help=f"python of a venv with Mosec (or {subjects.MOSEC_PYTHON_ENV})",
    )
    parser.add_argument("--quick", action="store_true", help="smoke-sized: 1 repeat of 1 s, 16 clients")
    cli.add_output(parser, workdir_help="keep logs here")
    args = parser.parse_args(argv)
    cli.refuse_below_one(parser, args, "repeats", "clients")
    if args.duration_s is not None and not args.duration_s > 0:
        parser.error(f"--duration-s: expected a positive number of seconds, got {args.duration_s}")
    mosec_python = args.mosec_python or (
        Path(os.environ[subjects.MOSEC_PYTHON_ENV]) if os.environ.get(subjects.MOSEC_PYTHON_ENV) else None
    )
    if mosec_python is not None and not mosec_python.is_file():
        parser.error(f"--mosec-python: no such interpreter: {mosec_python}")
    default = workload.Options()
    names = tuple(args.subjects) if args.subjects else default.subjects + (("mosec",) if mosec_python else ())
    if args.baseline_src is not None and not args.subjects:
        names += ("baseline",)
    options = workload.Options(subjects=names, baseline_src=args.baseline_src, mosec_python=mosec_python)
    if args.quick:
        options = dataclasses.replace(options, repeats=1, duration_s=1.0, clients=16, warmup_s=0.3)
    options = cli.overridden(options, args, "repeats", "clients", "duration_s")
    problem = workload.check_subjects(names, options)
    if problem is not None:
        parser.error(problem)
    return args, options


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, options = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not every readiness probe
    meta = run_meta(MODULE, argv)
    with tempfile.TemporaryDirectory(prefix="batchd-overhead-") as scratch:
        workdir = args.workdir or Path(scratch)
        measurements = workload.run(options, workdir)
    summaries = analysis.summarise(measurements)
    results = Results(
        meta, options.clients, options.duration_s, measurements, summaries, analysis.ratios(summaries)
    )
    data = write_results(results, args.output_dir)
    print(to_markdown(results))
    print(f"written: {data} and the .md beside it")
    errors = sum(s.errors for s in summaries)
    return cli.exit_status(f"{errors} request(s) failed" if errors else None)


if __name__ == "__main__":
    sys.exit(main())
