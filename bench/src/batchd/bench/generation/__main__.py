"""`python -m batchd.bench.generation`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import sys

from batchd.bench import generation
from batchd.bench.generation.analysis import Results
from batchd.bench.generation.report import draw_chart, to_markdown
from batchd.bench.generation.runner import run_model
from batchd.bench.generation.workload import MODELS, QUICK, Options
from batchd.bench.kit.command import Benchmark, Flag, Run, main


def measure(run: Run[Options]) -> Results:
    options = run.options
    return Results(
        meta=run.record,
        device=options.device,
        models={key: run_model(key, options, run.workdir) for key in options.models},
    )


BENCHMARK = Benchmark(
    module="batchd.bench.generation",
    doc=generation.__doc__,
    stem="generation",
    # On another device its figures go apart: generation-cuda.{json,md,png}.
    stem_for=lambda options: "generation" if options.device == "cpu" else f"generation-{options.device}",
    defaults=Options(),
    quick=QUICK,
    flags={
        "models": Flag("which models", choices=tuple(MODELS)),
        "repeats": Flag("interleaved repeats", minimum=1),
        "threads": Flag("torch threads of both replicas (OMP_NUM_THREADS)", minimum=1),
        "device": Flag("where both replicas run the model", choices=("cpu", "cuda")),
    },
    measure=measure,
    markdown=to_markdown,
    results=Results,
    chart=draw_chart,
)

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
