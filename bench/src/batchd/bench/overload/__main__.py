"""`python -m batchd.bench.overload`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import asyncio
import dataclasses
import sys

from batchd.bench import overload
from batchd.bench.kit.command import Benchmark, Flag, Run, main
from batchd.bench.overload import workload
from batchd.bench.overload.report import goals, markdown
from batchd.bench.overload.workload import QUICK, Options, Overload


def measure(run: Run[Options]) -> Overload:
    measured = asyncio.run(workload.run(run.options.duration_s, run.options.times, run.workdir))
    return dataclasses.replace(measured, meta=run.record)


def failure(measured: Overload) -> str | None:
    missed = [goal.name for goal in goals(measured) if not goal.met]
    return f"promises not kept: {'; '.join(missed)}" if missed else None


BENCHMARK = Benchmark(
    module="batchd.bench.overload",
    doc=overload.__doc__,
    stem="overload",
    defaults=Options(),
    quick=QUICK,
    flags={
        "duration_s": Flag("seconds of overload", above=0),
        "times": Flag("the load, as a multiple of capacity", above=0),
    },
    measure=measure,
    markdown=markdown,
    results=Overload,
    failure=failure,
)

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
