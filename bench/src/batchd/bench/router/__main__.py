"""`python -m batchd.bench.router`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from batchd.bench import router
from batchd.bench.kit import cli
from batchd.bench.kit.records import RunRecord
from batchd.bench.router.bound import run_bound
from batchd.bench.router.chart import draw_keepalive, draw_zero
from batchd.bench.router.clients import run_clients
from batchd.bench.router.cost import run_cost
from batchd.bench.router.keepalive import run_keepalive
from batchd.bench.router.options import (
    OPERATOR_POLL_S,
    QUICK_BOUND,
    QUICK_CLIENTS,
    QUICK_COST,
    QUICK_KEEPALIVE,
    QUICK_ZERO,
    BoundOptions,
    ClientsOptions,
    CostOptions,
    KeepaliveOptions,
    ZeroOptions,
)
from batchd.bench.router.report import to_markdown, write_results
from batchd.bench.router.results import Results
from batchd.bench.router.zero import run_zero
from batchd.testing.kubernetes.started import benchmark_control_plane

PARTS = ("keepalive", "cost", "zero", "clients", "bound")
MODULE = "batchd.bench.router"


ROUTED_PARTS = {"keepalive", "cost", "zero"}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = cli.parser(MODULE, router.__doc__)
    parser.add_argument("parts", nargs="*", help=f"which parts: {', '.join(PARTS)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="smoke-sized: short runs, one repeat")
    parser.add_argument("--repeats", type=int, default=None, help="repeats of every part")
    parser.add_argument(
        "--poll-s",
        type=float,
        default=None,
        help=f"zero: how often the stand-in reads GET /held ({OPERATOR_POLL_S:g}, the operator's default)",
    )
    cli.add_output(parser, workdir_help="keep logs here")
    args = parser.parse_args(argv)
    cli.refuse_below_one(parser, args, "repeats")
    if args.poll_s is not None and not args.poll_s > 0:
        parser.error(f"--poll-s: expected a positive number of seconds, got {args.poll_s}")
    for part in args.parts:
        if part not in PARTS:
            parser.error(f"part: expected one of {', '.join(PARTS)}, got {part!r}")
    return args


async def _run(args: argparse.Namespace, argv: Sequence[str], workdir: Path) -> Results:
    meta = RunRecord.now(MODULE, argv)
    parts = args.parts or PARTS
    keepalive = cost = zero = None
    if ROUTED_PARTS & set(parts):
        # The parts with a router read their deployment and replicas from a real API server.
        with benchmark_control_plane(workdir / "control-plane") as cluster:
            if "keepalive" in parts:
                options = cli.overridden(
                    QUICK_KEEPALIVE if args.quick else KeepaliveOptions(), args, "repeats"
                )
                keepalive = await run_keepalive(options, cluster, workdir, meta)
            if "cost" in parts:
                cost_options = cli.overridden(QUICK_COST if args.quick else CostOptions(), args, "repeats")
                cost = await run_cost(cost_options, cluster, workdir, meta)
            if "zero" in parts:
                zero_options = cli.overridden(
                    QUICK_ZERO if args.quick else ZeroOptions(), args, "repeats", "poll_s"
                )
                zero = await run_zero(zero_options, cluster, workdir, meta)
    clients = None
    if "clients" in parts:
        clients_options = cli.overridden(QUICK_CLIENTS if args.quick else ClientsOptions(), args, "repeats")
        clients = await run_clients(clients_options, workdir, meta)
    bound = None
    if "bound" in parts:
        bound_options = cli.overridden(QUICK_BOUND if args.quick else BoundOptions(), args, "repeats")
        bound = await run_bound(bound_options, workdir, meta)
    return Results(keepalive, cost, zero, clients, bound)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="batchd-router-bench-") as temporary:
        workdir = args.workdir or Path(temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        new = asyncio.run(_run(args, argv, workdir))
    results = write_results(args.output_dir, new)
    if new.keepalive is not None:
        draw_keepalive(new.keepalive, args.output_dir / "router-keepalive.png")
    if new.zero is not None:
        draw_zero(new.zero, args.output_dir / "router-zero.png")
    print(to_markdown(results))
    print(f"results: {args.output_dir / 'router.json'}, .md and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
