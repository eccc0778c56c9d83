"""`python -m batchd.bench.overload`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from batchd.bench import overload
from batchd.bench.kit import RESULTS_DIR, records
from batchd.bench.overload.report import markdown, verdicts
from batchd.bench.overload.workload import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m batchd.bench.overload", description=(overload.__doc__ or "").splitlines()[0]
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of overload (default 60)")
    parser.add_argument(
        "--times", type=float, default=10.0, help="load as a multiple of capacity (default 10)"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="batchd-overload-") as workdir:
        report = asyncio.run(run(args.duration, args.times, Path(workdir)))
    text = markdown(report)
    print(text)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    records.write_json(RESULTS_DIR / "overload.json", report)
    (RESULTS_DIR / "overload.md").write_text(text)
    return 0 if all(verdicts(report).values()) else 1


if __name__ == "__main__":
    sys.exit(main())
