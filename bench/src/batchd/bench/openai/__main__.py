"""`python -m batchd.bench.openai`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import sys

from batchd.bench import openai
from batchd.bench.kit.command import Benchmark, Flag, Run, main
from batchd.bench.openai.analysis import Results, embedding_points, streaming_points
from batchd.bench.openai.report import to_markdown
from batchd.bench.openai.runner import measure_embeddings, measure_streaming
from batchd.bench.openai.workload import PARTS, QUICK, Options


def measure(run: Run[Options]) -> Results:
    options = run.options
    embedding_runs, streaming_runs = [], []
    if "embeddings" in options.parts:
        embedding_runs = measure_embeddings(options.embeddings, options.repeats, run.workdir, options.threads)
    if "streaming" in options.parts:
        streaming_runs = measure_streaming(options.streaming, options.repeats, run.workdir, options.threads)
    return Results(
        meta=run.record,
        repeats=options.repeats,
        torch_threads=options.threads,
        embeddings=embedding_points(embedding_runs),
        streaming=streaming_points(streaming_runs),
        embedding_runs=embedding_runs,
        streaming_runs=streaming_runs,
    )


BENCHMARK = Benchmark(
    module="batchd.bench.openai",
    doc=openai.__doc__,
    stem="openai",
    defaults=Options(),
    quick=QUICK,
    flags={
        "parts": Flag("which parts", choices=PARTS),
        "repeats": Flag("repeats, both routes at once in each", minimum=1),
        "threads": Flag("torch threads per replica (OMP_NUM_THREADS)", minimum=1),
    },
    measure=measure,
    markdown=to_markdown,
    results=Results,
)

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
