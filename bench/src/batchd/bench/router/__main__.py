"""`python -m batchd.bench.router`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any, TypeVar

from batchd.bench import router
from batchd.bench.kit import records
from batchd.bench.kit.command import Benchmark, Flag, Run, main
from batchd.bench.router.analysis import Results
from batchd.bench.router.cost import run_cost
from batchd.bench.router.keepalive import run_keepalive
from batchd.bench.router.options import OPERATOR_POLL_S, PARTS, QUICK, Options
from batchd.bench.router.report import draw_keepalive, draw_zero, to_markdown
from batchd.bench.router.zero import run_zero
from batchd.testing.kubernetes.started import benchmark_control_plane

STEM = "router"
PartT = TypeVar("PartT")


def given(part: PartT, options: Options) -> PartT:
    """A part's options with what the command line gave for every part."""
    changes: dict[str, Any] = {}
    for name in ("repeats", "poll_s"):
        value = getattr(options, name)
        if value is not None and hasattr(part, name):
            changes[name] = value
    return dataclasses.replace(part, **changes)  # type: ignore[type-var]


async def _measure(run: Run[Options]) -> Results:
    parts, options, workdir, meta = run.args.parts or PARTS, run.options, run.workdir, run.record
    new: dict[str, object] = {}
    with benchmark_control_plane(workdir / "control-plane") as cluster:  # the router reads it
        if "keepalive" in parts:
            new["keepalive"] = await run_keepalive(given(options.keepalive, options), cluster, workdir, meta)
        if "cost" in parts:
            new["cost"] = await run_cost(given(options.cost, options), cluster, workdir, meta)
        if "zero" in parts:
            new["zero"] = await run_zero(given(options.zero, options), cluster, workdir, meta)
    before = records.read_sections(Results, run.output_dir / f"{STEM}.json")
    return records.newer(Results(**new), before)  # type: ignore[arg-type]


def measure(run: Run[Options]) -> Results:
    return asyncio.run(_measure(run))


def chart(results: Results, path: Path) -> None:
    """A chart per part that has one, beside `path`: router-keepalive.png and router-zero.png."""
    if results.keepalive is not None:
        draw_keepalive(results.keepalive, path.with_name(f"{STEM}-keepalive.png"))
    if results.zero is not None:
        draw_zero(results.zero, path.with_name(f"{STEM}-zero.png"))


def parts_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("parts", nargs="*", help=f"which parts: {', '.join(PARTS)} (default: all)")


def check(args: argparse.Namespace) -> str | None:
    unknown = [part for part in args.parts if part not in PARTS]
    return f"part: expected one of {', '.join(PARTS)}, got {unknown[0]!r}" if unknown else None


BENCHMARK = Benchmark(
    module="batchd.bench.router",
    doc=router.__doc__,
    stem=STEM,
    defaults=Options(),
    quick=QUICK,
    flags={
        "repeats": Flag("repeats of every part", minimum=1),
        "poll_s": Flag(
            f"zero: how often the stand-in reads GET /held (the operator's: {OPERATOR_POLL_S:g})", above=0
        ),
    },
    measure=measure,
    markdown=to_markdown,
    results=Results,
    chart=chart,
    extra_arguments=parts_argument,
    check=check,
    workdir_help="keep logs here",
    log_level=logging.WARNING,
)

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
