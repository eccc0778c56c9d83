"""`python -m batchd.bench.priority`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import sys

from batchd.bench import priority
from batchd.bench.kit.command import Benchmark, Flag, main
from batchd.bench.priority import runner
from batchd.bench.priority.analysis import Results
from batchd.bench.priority.report import draw_chart, to_markdown
from batchd.bench.priority.workload import QUICK, Options


def failure(results: Results) -> str | None:
    answered = {
        "priority": [
            run.high.answered + run.low.answered for runs in results.priority.values() for run in runs
        ],
        "equal-class": [
            run.gold.answered + run.silver.answered for runs in results.equal.values() for run in runs
        ],
        "dead-item": [run.high_answered for runs in results.dead.values() for run in runs],
        # Under first come the high class may find the queue full of the sheddable one throughout.
        "token-level": [
            run.idle_high.answered + run.high.answered + run.bulk.answered
            for runs in results.generation.values()
            for run in runs
        ],
    }
    silent = [load for load, counts in answered.items() if not all(counts)]
    return f"a {silent[0]} load got no answer at all" if silent else None


BENCHMARK = Benchmark(
    module="batchd.bench.priority",
    doc=priority.__doc__,
    stem="priority",
    defaults=Options(),
    quick=QUICK,
    flags={
        "repeats": Flag("interleaved repeats", minimum=1),
        "duration_s": Flag("seconds of each load", above=0),
    },
    measure=lambda run: runner.measure(run.options, run.workdir, run.record),
    markdown=to_markdown,
    results=Results,
    chart=draw_chart,
    failure=failure,
)

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
