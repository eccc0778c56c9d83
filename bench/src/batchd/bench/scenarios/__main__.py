"""The main scenarios (`make bench`, `python -m batchd.bench`): run them, write JSON and markdown.

    python -m batchd.bench                       # every scenario, 3 repeats (about 10 minutes)
    python -m batchd.bench --quick               # smoke-sized: one load, one repeat, short runs
    python -m batchd.bench --scenario minilm --repeats 5

Results go to bench/results/latest.json and latest.md (or --output-dir). The exit status is
non-zero when a scenario could not be measured (a server failed to start, a request errored
in every run); missed performance targets are reported, not failed on.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

from batchd.bench.kit import cli, records
from batchd.bench.scenarios import analysis, catalog, harness, report
from batchd.bench.scenarios.results import BenchRecord, BenchResult, ScenarioResult


def versions() -> dict[str, str]:
    import importlib.metadata as metadata

    found = {"python": platform.python_version()}
    for package in ("torch", "transformers", "uvicorn", "fastapi"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[package] = metadata.version(package)
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = cli.parser("batchd.bench", __doc__)
    parser.add_argument("--quick", action="store_true", help="smoke-sized run (seconds, not minutes)")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=sorted(catalog.all_scenarios()),
        help="run only this scenario (repeatable); default: all",
    )
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats per point (default 3)")
    parser.add_argument("--duration-s", type=float, default=None, help="seconds per load run (default 3)")
    parser.add_argument("--concurrency", type=int, action="append", help="closed-loop clients (repeatable)")
    cli.add_output(parser, workdir_help="keep manifests, models and logs here")
    args = parser.parse_args(argv)
    cli.refuse_below_one(parser, args, "repeats")
    return args


def options_from(args: argparse.Namespace) -> harness.Options:
    chosen = tuple(args.scenario or ("trivial", "minilm", "gpt2"))
    if args.quick:
        base = harness.Options(
            scenarios=chosen,
            repeats=1,
            duration_s=1.0,
            warmup_s=0.2,
            concurrencies=(8,),
            ceiling_duration_s=1.0,
        )
    else:
        base = harness.Options(scenarios=chosen)
    options = cli.overridden(base, args, "repeats", "duration_s")
    return replace(options, concurrencies=tuple(args.concurrency)) if args.concurrency else options


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    options = options_from(args)
    every = catalog.all_scenarios()
    record = records.RunRecord.now("batchd.bench", argv if argv is not None else sys.argv[1:])
    meta = BenchRecord(
        **asdict(record),
        versions=versions(),
        repeats=options.repeats,
        duration_s=options.duration_s,
        options=asdict(options),
    )
    measured: dict[str, ScenarioResult] = {}
    failures: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="batchd-bench-") as temporary:
        workdir = args.workdir or Path(temporary)
        for name in options.scenarios:
            try:
                measured[name] = harness.run_scenario(every[name], options, workdir / name)
            except Exception as error:  # one broken scenario must not hide the others' numbers
                logging.exception("scenario %s failed", name)
                failures[name] = f"{type(error).__name__}: {error}"
    result = BenchResult(meta, measured, failures, analysis.check_targets(measured))
    markdown = report.to_markdown(result)
    if failures:
        markdown += "\n" + "\n".join(f"- **{n} failed**: {e.splitlines()[0]}" for n, e in failures.items())
    records.publish(args.output_dir, "latest", result, markdown)
    print(markdown)
    print(f"results: {args.output_dir / 'latest.json'} and {args.output_dir / 'latest.md'}")
    return cli.exit_status(f"scenario(s) failed: {', '.join(failures)}" if failures else None)


if __name__ == "__main__":
    sys.exit(main())
