"""`python -m batchd.bench.peers`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from batchd.bench import peers
from batchd.bench.kit import cli
from batchd.bench.kit.records import RunRecord
from batchd.bench.peers import venvs
from batchd.bench.peers.catalog import MODELS, PEERS
from batchd.bench.peers.chart import draw
from batchd.bench.peers.options import QUICK, Options, placement
from batchd.bench.peers.report import read_results, to_markdown, write_results
from batchd.bench.peers.results import Results
from batchd.bench.peers.servers import models
from batchd.bench.peers.workload import environments, run_all

MODULE = "batchd.bench.peers"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = cli.parser(MODULE, peers.__doc__)
    parser.add_argument("--peers", nargs="+", default=None, help=f"which: {', '.join(PEERS)} (default: all)")
    parser.add_argument(
        "--models", nargs="+", default=None, help=f"which: {', '.join(MODELS)} (default: all)"
    )
    parser.add_argument(
        "--device", choices=models.DEVICES, default=None, help="where the models run (default: cpu)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke-sized: short runs, one repeat")
    parser.add_argument("--repeats", type=int, default=None, help="repeats of every (model, peer)")
    parser.add_argument("--duration-s", type=float, default=None, help="each measured closed loop")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=venvs.CACHE_DIR,
        help="the peers' environments are made and kept here",
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="measure nothing: write the report and chart of this peers.json",
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="a replica source tree (replica/src of another commit) to run as the peer `baseline`",
    )
    cli.add_output(parser, workdir_help="keep the servers' logs here")
    args = parser.parse_args(argv)
    cli.refuse_below_one(parser, args, "repeats")
    if args.duration_s is not None and not args.duration_s > 0:
        parser.error(f"--duration-s: expected a positive number of seconds, got {args.duration_s}")
    for option, known in (("peers", PEERS), ("models", MODELS)):
        for name in getattr(args, option) or ():
            if name not in known:
                parser.error(f"--{option}: expected some of {', '.join(known)}, got {name!r}")
    if "baseline" in (args.peers or ()) and args.baseline_src is None:
        parser.error("--peers: baseline needs --baseline-src, the replica source tree it runs from")
    if args.baseline_src is not None and not (args.baseline_src / "batchd" / "replica").is_dir():
        parser.error(
            f"--baseline-src: expected a replica source tree (batchd/replica in it), got {args.baseline_src}"
        )
    return args


def options_from(args: argparse.Namespace) -> Options:
    options = cli.overridden(QUICK if args.quick else Options(), args, "repeats", "duration_s", "device")
    if args.baseline_src is not None:
        baseline = str(args.baseline_src.resolve())
        options = dataclasses.replace(options, baseline_src=baseline, peers=(*options.peers, "baseline"))
    return cli.overridden(options, args, "peers", "models")


def describe(server_cores: set[int] | None, load_cores: set[int] | None) -> str:
    if not server_cores or not load_cores:
        return f"no pinning: {len(os.sched_getaffinity(0))} core(s), servers and load share them"
    return (
        f"every server process on core {','.join(map(str, sorted(server_cores)))}, the load generator "
        f"on core {','.join(map(str, sorted(load_cores)))}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.from_json is not None:
        report(read_results(args.from_json), args.output_dir)
        return 0
    options = options_from(args)
    meta = RunRecord.now(MODULE, argv)
    server_cores, load_cores = placement()
    pythons, infos = environments(options.peers, args.cache_dir)
    if load_cores:
        os.sched_setaffinity(0, load_cores)  # this process drives the load
    with tempfile.TemporaryDirectory(prefix="batchd-peers-bench-") as temporary:
        workdir = args.workdir or Path(temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        runs, ceilings = run_all(options, pythons, workdir, server_cores)
    results = Results(
        meta, dataclasses.asdict(options), describe(server_cores, load_cores), infos, runs, ceilings
    )
    report(results, args.output_dir)
    return cli.exit_status(None if any(run.measured for run in runs) else "no run could be measured")


def report(results: Results, output_dir: Path) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    write_results(output_dir, results)
    draw(results, output_dir / "peers.png")
    print(to_markdown(results))
    print(f"results: {output_dir / 'peers.json'}, .md and .png")


if __name__ == "__main__":
    sys.exit(main())
