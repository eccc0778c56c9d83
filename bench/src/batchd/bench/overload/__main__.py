"""`python -m batchd.bench.overload`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from batchd.bench import overload
from batchd.bench.kit import cli, records
from batchd.bench.overload.report import markdown, verdicts
from batchd.bench.overload.workload import run


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser("batchd.bench.overload", overload.__doc__)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of overload (default 60)")
    parser.add_argument(
        "--times", type=float, default=10.0, help="load as a multiple of capacity (default 10)"
    )
    cli.add_output(parser)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="batchd-overload-") as workdir:
        report = asyncio.run(run(args.duration, args.times, Path(workdir)))
    text = markdown(report)
    print(text)
    meta = records.run_meta("batchd.bench.overload", sys.argv[1:] if argv is None else argv)
    records.publish(args.output_dir, "overload", {"meta": meta, **records.to_json(report)}, text)
    return 0 if all(verdicts(report).values()) else 1


if __name__ == "__main__":
    sys.exit(main())
