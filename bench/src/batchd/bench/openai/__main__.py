"""`python -m batchd.bench.openai`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from batchd.bench import openai
from batchd.bench.kit import cli, records
from batchd.bench.openai.analysis import Results, embedding_points, streaming_points
from batchd.bench.openai.report import to_markdown
from batchd.bench.openai.runner import measure_embeddings, measure_streaming
from batchd.bench.openai.workload import EMBEDDINGS, QUICK, STREAMING

PARTS = ("embeddings", "streaming")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = cli.parser("batchd.bench.openai", openai.__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="smoke-sized: two client counts, short runs, one repeat"
    )
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="repeats, both routes at once in each (default 5; 1 with --quick)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads per replica (OMP_NUM_THREADS; default 1, as the other benchmarks)",
    )
    cli.add_output(parser, workdir_help="models and logs (default: a temporary folder)")
    args = parser.parse_args(argv)
    cli.refuse_below_one(parser, args, "repeats", "threads")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    repeats = args.repeats or (1 if args.quick else 5)
    embeddings = QUICK["embeddings"] if args.quick else EMBEDDINGS
    streaming = QUICK["streaming"] if args.quick else STREAMING
    with tempfile.TemporaryDirectory(prefix="batchd-openai-") as temporary:
        workdir = args.workdir or Path(temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        embedding_runs = (
            measure_embeddings(embeddings, repeats, workdir, args.threads)
            if "embeddings" in args.parts
            else []
        )
        streaming_runs = (
            measure_streaming(streaming, repeats, workdir, args.threads) if "streaming" in args.parts else []
        )
    results = Results(
        meta=records.RunRecord.now("batchd.bench.openai", argv),
        repeats=repeats,
        torch_threads=args.threads,
        embeddings=embedding_points(embedding_runs),
        streaming=streaming_points(streaming_runs),
        embedding_runs=embedding_runs,
        streaming_runs=streaming_runs,
    )
    markdown = to_markdown(results)
    records.publish(args.output_dir, "openai", results, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
