"""`python -m batchd.bench.adaptive`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from batchd.bench import adaptive
from batchd.bench.adaptive.chart import draw_chart
from batchd.bench.adaptive.options import MODELS, QUICK, Options
from batchd.bench.adaptive.report import to_markdown
from batchd.bench.adaptive.results import ModelResult, Report
from batchd.bench.adaptive.workload import run_model
from batchd.bench.kit import cli, records


def read_report(path: Path) -> Report:
    """adaptive.json as written before: every model whose results it still reads (none if absent)."""
    if not path.exists():
        return Report({})
    models: dict[str, ModelResult] = {}
    for model, data in json.loads(path.read_text()).get("models", {}).items():
        with contextlib.suppress(TypeError, KeyError, ValueError):  # a result from an older shape
            models[model] = records.from_json(ModelResult, data)
    return Report(models)


def write_reports(report: Report, output: Path) -> None:
    """adaptive.json, adaptive.md and adaptive.png."""
    text = to_markdown(report)
    records.publish(output, "adaptive", report, text)
    draw_chart(report, output / "adaptive.png")
    print(text)
    print(f"results: {output / 'adaptive.json'}, .md and .png")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = cli.parser("batchd.bench.adaptive", adaptive.__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke-sized: cost-curve handler, one repeat")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=None)
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 3)")
    parser.add_argument("--duration-s", type=float, default=None, help="measured seconds per open loop (10)")
    parser.add_argument("--arrivals", choices=("poisson", "uniform"), default=None)
    parser.add_argument(
        "--fractions",
        type=float,
        nargs="+",
        default=None,
        help="open-loop rates, of capacity (0.1 0.5 0.8 0.95)",
    )
    parser.add_argument("--windows-ms", type=float, nargs="+", default=None, help="fixed windows (0 2 10 50)")
    parser.add_argument("--burst-cycles", type=int, default=None, help="on/off cycles of the bursty load (4)")
    cli.add_output(parser, workdir_help="keep the manifests and replica logs here")
    parser.add_argument(
        "--render", type=Path, default=None, metavar="JSON", help="only rewrite the .md and .png from a .json"
    )
    args = parser.parse_args(argv)
    cli.refuse_below_one(parser, args, "repeats", "burst_cycles")
    if args.fractions is not None and not all(0 < f <= 2 for f in args.fractions):
        parser.error(f"--fractions: expected shares of capacity above 0 and at most 2, got {args.fractions}")
    if args.windows_ms is not None and any(ms < 0 for ms in args.windows_ms):
        parser.error(f"--windows-ms: expected 0 or more, got {args.windows_ms}")
    return args


def options_from(args: argparse.Namespace) -> Options:
    names = ("models", "repeats", "duration_s", "arrivals", "fractions", "windows_ms", "burst_cycles")
    return cli.overridden(QUICK if args.quick else Options(), args, *names)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    options = options_from(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    output = args.output_dir
    output.mkdir(parents=True, exist_ok=True)
    if args.render is not None:
        write_reports(read_report(args.render), output)
        return 0
    # SIGTERM unwinds like Ctrl-C, so that the replicas are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    report = read_report(output / "adaptive.json")  # other models' results, from an earlier run, stay
    with tempfile.TemporaryDirectory(prefix="batchd-adaptive-") as temporary:
        workdir = args.workdir or Path(temporary)
        for model in options.models:
            record = records.RunRecord.now("batchd.bench.adaptive", argv)
            report.models[model] = run_model(model, options, workdir, record)
            ordered = {m: report.models[m] for m in (*MODELS, *report.models) if m in report.models}
            report = Report(ordered)
            records.write_json(output / "adaptive.json", report)
    write_reports(report, output)
    errors = {
        model: sum(
            f.errors_total for by_load in report.models[model].summary.values() for f in by_load.values()
        )
        for model in options.models
    }
    return cli.exit_status(f"requests without a 200: {errors}" if any(errors.values()) else None)


if __name__ == "__main__":
    sys.exit(main())
