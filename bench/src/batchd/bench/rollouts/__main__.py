"""`python -m batchd.bench.rollouts`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import asyncio
import sys

from batchd.bench import rollouts
from batchd.bench.kit.command import Benchmark, Flag, Run, main
from batchd.bench.rollouts.analysis import Results
from batchd.bench.rollouts.report import draw_chart, to_markdown
from batchd.bench.rollouts.runner import run_all
from batchd.bench.rollouts.workload import QUICK, Options
from batchd.testing.kubernetes.started import benchmark_cluster


def measure(run: Run[Options]) -> Results:
    with benchmark_cluster(run.workdir) as cluster:
        return asyncio.run(run_all(run.options, cluster, run.workdir, run.record))


def failure(results: Results) -> str | None:
    good = results.runs["canary-good"]
    return None if all(run.ended == "Promoted" for run in good) else "the good revision was not promoted"


BENCHMARK = Benchmark(
    module="batchd.bench.rollouts",
    doc=rollouts.__doc__,
    stem="rollouts",
    defaults=Options(),
    quick=QUICK,
    flags={
        "repeats": Flag("interleaved repeats", minimum=1),
        "rate": Flag("requests a second", above=0),
    },
    measure=measure,
    markdown=to_markdown,
    results=Results,
    chart=draw_chart,
    failure=failure,
    workdir_help="keep logs and pod folders here",
    quiet_loggers=("aiohttp.access", "httpx"),
)

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
