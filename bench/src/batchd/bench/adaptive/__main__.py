"""`python -m batchd.bench.adaptive`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from batchd.bench import adaptive
from batchd.bench.adaptive.chart import draw_chart
from batchd.bench.adaptive.options import MODELS, QUICK, Options
from batchd.bench.adaptive.report import to_markdown
from batchd.bench.adaptive.workload import run_model
from batchd.bench.kit import cli, records


def write_reports(report: dict[str, Any], output: Path) -> None:
    """adaptive.md and adaptive.png from a report as adaptive.json holds it (null for a missing figure)."""
    report = records.none_to_nan(report)
    text = to_markdown(report)
    (output / "adaptive.md").write_text(text)
    draw_chart(report, output / "adaptive.png")
    print(text)
    print(f"results: {output / 'adaptive.json'}, .md and .png")


def render(path: Path, output: Path) -> int:
    output.mkdir(parents=True, exist_ok=True)
    write_reports(json.loads(path.read_text()), output)
    return 0


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
    if args.render is not None:
        return render(args.render, args.output_dir)
    # SIGTERM unwinds like Ctrl-C, so that the replicas are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    output = args.output_dir
    output.mkdir(parents=True, exist_ok=True)
    path = output / "adaptive.json"
    report: dict[str, Any] = {"models": {}}
    if path.exists():  # other models' results, from an earlier run, stay
        with contextlib.suppress(ValueError, KeyError):
            report["models"] = {
                m: r for m, r in json.loads(path.read_text())["models"].items() if "meta" in r
            }
    errors: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="batchd-adaptive-") as temporary:
        workdir = args.workdir or Path(temporary)
        for model in options.models:
            meta = {
                **records.run_meta("batchd.bench.adaptive", argv),
                "load_average_before": os.getloadavg()[0],
            }
            result = run_model(model, options, workdir)
            meta["load_average_after"] = os.getloadavg()[0]
            meta["minutes"] = round((time.time() - result.pop("started")) / 60, 1)
            report["models"][model] = {
                "meta": meta,
                "options": {
                    **asdict(options),
                    "subjects": list(options.subjects),
                    "loads": list(options.loads),
                },
                **result,
            }
            ordered = {m: report["models"][m] for m in (*MODELS, *report["models"]) if m in report["models"]}
            report["models"] = ordered
            records.write_json(path, report)
            errors[model] = sum(
                f["errors_total"] for by_load in result["summary"].values() for f in by_load.values()
            )
    write_reports(json.loads(path.read_text()), output)
    if any(errors.values()):
        print(f"FAILED: requests without a 200: {errors}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
