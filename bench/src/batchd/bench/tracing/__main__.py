"""`python -m batchd.bench.tracing`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys

from batchd.bench import tracing
from batchd.bench.kit.command import Benchmark, Flag, Run, main
from batchd.bench.tracing.analysis import Results, failure
from batchd.bench.tracing.options import MODELS, QUICK, Options
from batchd.bench.tracing.report import draw, to_markdown
from batchd.bench.tracing.spancost import span_cost
from batchd.bench.tracing.workload import run_model
from batchd.testing.jaeger import jaeger
from batchd.testing.kubernetes.started import benchmark_control_plane


async def _measure(run: Run[Options]) -> Results:
    options, workdir = run.options, run.workdir
    results = Results(run.record, dataclasses.asdict(options))
    with (
        benchmark_control_plane(workdir / "control-plane") as cluster,  # the routers read it
        jaeger(workdir / "jaeger", cluster.address) as backend,
    ):
        for model in options.models:
            rounds, stored = await run_model(model, options, cluster, backend, workdir)
            results.rounds.extend(rounds)
            results.stored.extend(stored)
    return dataclasses.replace(results, spans=span_cost(options.span_requests, options.span_rounds))


def measure(run: Run[Options]) -> Results:
    return asyncio.run(_measure(run))


BENCHMARK = Benchmark(
    module="batchd.bench.tracing",
    doc=tracing.__doc__,
    stem="tracing",
    defaults=Options(),
    quick=QUICK,
    flags={
        "models": Flag("which models", choices=MODELS),
        "repeats": Flag("repeats of every setting", minimum=1),
        "seconds": Flag("each measured closed loop, in seconds", above=0),
        "adder_clients": Flag("requests in flight on the adder", minimum=1),
        "minilm_clients": Flag("requests in flight on MiniLM", minimum=1),
    },
    measure=measure,
    markdown=to_markdown,
    results=Results,
    chart=draw,
    failure=failure,
    workdir_help="keep the servers' files and logs here",
    log_level=logging.WARNING,
)

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
