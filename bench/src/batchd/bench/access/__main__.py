"""`python -m batchd.bench.access`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import asyncio
import logging
import sys
from concurrent.futures import ThreadPoolExecutor

from batchd.bench import access
from batchd.bench.access.analysis import Results, failure
from batchd.bench.access.options import QUICK, Options
from batchd.bench.access.probe import build_probe_model
from batchd.bench.access.report import draw, to_markdown
from batchd.bench.access.workload import run
from batchd.bench.kit.command import Benchmark, Flag, Run, main
from batchd.testing.kubernetes.started import benchmark_control_plane


async def _measure(job: Run[Options]) -> Results:
    with ThreadPoolExecutor(1) as builder:
        # The probe's model is built while the control plane starts: neither needs the other.
        model = builder.submit(build_probe_model, job.workdir) if job.options.probe_tries else None
        with benchmark_control_plane(job.workdir / "control-plane") as cluster:  # the router reads it
            return await run(job.options, cluster, job.workdir, job.record, model)


def measure(job: Run[Options]) -> Results:
    return asyncio.run(_measure(job))


BENCHMARK = Benchmark(
    module="batchd.bench.access",
    doc=access.__doc__,
    stem="access",
    defaults=Options(),
    quick=QUICK,
    flags={
        "repeats": Flag("repeats of every way in", minimum=1),
        "seconds": Flag("each measured closed loop, in seconds", above=0),
        "in_flight": Flag("requests in flight while the router's CPU is read", minimum=1),
        "probe_tries": Flag("tries of the cache probe (0: none)", minimum=0),
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
