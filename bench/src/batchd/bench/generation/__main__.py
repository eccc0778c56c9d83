"""`python -m batchd.bench.generation`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from batchd.bench import generation
from batchd.bench.generation.analysis import Results
from batchd.bench.generation.chart import draw_chart
from batchd.bench.generation.report import to_markdown
from batchd.bench.generation.runner import run_model
from batchd.bench.generation.workload import MODELS, QUICK
from batchd.bench.kit import cli, records


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = cli.parser("batchd.bench.generation", generation.__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke-sized: few rates, short runs, one repeat")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS, reverse=True))
    parser.add_argument(
        "--repeats", type=int, default=None, help="interleaved repeats (default 3; 1 with --quick)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of both replicas (OMP_NUM_THREADS; default 1: on 2 shared cores, one intra-op "
        "thread beside the load generator was faster for both modes)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where both replicas run the model (cuda: results go to generation-cuda.{json,md,png})",
    )
    cli.add_output(parser)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="models and logs (default: a temporary folder)"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    setups = QUICK if args.quick else MODELS
    repeats = args.repeats or (1 if args.quick else 3)
    with tempfile.TemporaryDirectory(prefix="batchd-generation-") as temporary:
        workdir = args.workdir or Path(temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        results = Results(
            meta=records.RunRecord.now("batchd.bench.generation", argv),
            device=args.device,
            models={
                key: run_model(key, setups[key], repeats, workdir, args.threads, args.device)
                for key in args.models
            },
        )
    stem = "generation" if args.device == "cpu" else f"generation-{args.device}"
    markdown = to_markdown(results)
    records.publish(args.output_dir, stem, results, markdown)
    draw_chart(results, args.output_dir / f"{stem}.png")
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
