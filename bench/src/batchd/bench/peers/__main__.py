"""`python -m batchd.bench.peers`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path

from batchd.bench import peers
from batchd.bench.kit.command import Benchmark, Flag, Run, main
from batchd.bench.kit.peer_servers import venvs
from batchd.bench.kit.peer_servers.catalog import MODELS, PEERS, Options, describe, placement
from batchd.bench.kit.peer_servers.results import Results
from batchd.bench.kit.peer_servers.servers import models
from batchd.bench.kit.peer_servers.workload import environments, run_all
from batchd.bench.peers.report import draw, to_markdown


def extra_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=venvs.CACHE_DIR,
        help="the peers' environments are made and kept here",
    )


def check(args: argparse.Namespace) -> str | None:
    if "baseline" in (args.peers or ()) and args.baseline_src is None:
        return "--peers: baseline needs --baseline-src, the replica source tree it runs from"
    if args.baseline_src is not None and not (Path(args.baseline_src) / "batchd" / "replica").is_dir():
        return (
            f"--baseline-src: expected a replica source tree (batchd/replica in it), got {args.baseline_src}"
        )
    return None


def with_baseline(options: Options) -> Options:
    """With a baseline tree, batchd from that tree is a peer of its own (`baseline`)."""
    if options.baseline_src is None or "baseline" in options.peers:
        return options
    tree = str(Path(options.baseline_src).resolve())
    return dataclasses.replace(options, baseline_src=tree, peers=(*options.peers, "baseline"))


def measure(run: Run[Options]) -> Results:
    options = with_baseline(run.options)
    server_cores, load_cores = placement()
    pythons, infos = environments(options.peers, run.args.cache_dir)
    if load_cores:
        os.sched_setaffinity(0, load_cores)  # this process drives the load
    runs, ceilings = run_all(options, pythons, run.workdir, server_cores)
    placed = describe(server_cores, load_cores)
    return Results(run.record, dataclasses.asdict(options), placed, infos, runs, ceilings)


# The smoke-sized run.
QUICK = Options(repeats=1, duration_s=1.0, warmup_s=0.3, ceiling_s=0.5, ready_timeout_s=120.0)

BENCHMARK = Benchmark(
    module="batchd.bench.peers",
    doc=peers.__doc__,
    stem="peers",
    defaults=Options(),
    quick=QUICK,
    flags={
        "peers": Flag("which peers", choices=tuple(PEERS)),
        "models": Flag("which models", choices=tuple(MODELS)),
        "device": Flag("where the models run", choices=models.DEVICES),
        "repeats": Flag("repeats of every (model, peer)", minimum=1),
        "duration_s": Flag("each measured closed loop, in seconds", above=0),
        "baseline_src": Flag(
            "a replica source tree (replica/src of another commit) to run as the peer `baseline`"
        ),
    },
    measure=measure,
    markdown=to_markdown,
    results=Results,
    chart=draw,
    failure=lambda results: None if any(run.measured for run in results.runs) else "no run could be measured",
    extra_arguments=extra_arguments,
    check=check,
    log_level=logging.WARNING,
)

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
