"""`python -m batchd.bench.adaptive`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from batchd.bench import adaptive
from batchd.bench.adaptive.analysis import ModelResult, Report
from batchd.bench.adaptive.report import draw_chart, to_markdown
from batchd.bench.adaptive.runner import run_model
from batchd.bench.adaptive.workload import MODELS, QUICK, Options
from batchd.bench.kit import records
from batchd.bench.kit.command import Benchmark, Flag, Run, main

STEM = "adaptive"


def earlier(path: Path) -> dict[str, ModelResult]:
    """Every model's results that `path` (written before) still reads; none if absent."""
    models: dict[str, ModelResult] = {}
    for model, data in (json.loads(path.read_text()).get("models", {}) if path.exists() else {}).items():
        with contextlib.suppress(TypeError, KeyError, ValueError):  # a result from an older shape
            models[model] = records.from_json(ModelResult, data)
    return models


def measure(run: Run[Options]) -> Report:
    """Model by model, written after each: a run of some models replaces theirs and keeps the rest."""
    models = earlier(run.output_dir / f"{STEM}.json")
    report = Report(models)
    for model in run.options.models:
        models[model] = run_model(model, run.options, run.workdir, run.record)
        report = Report({m: models[m] for m in (*MODELS, *models) if m in models})  # the known ones first
        records.write_json(run.output_dir / f"{STEM}.json", report)
    return report


def failure(report: Report) -> str | None:
    errors = {
        model: sum(f.errors_total for by_load in result.summary.values() for f in by_load.values())
        for model, result in report.models.items()
    }
    return f"requests without a 200: {errors}" if any(errors.values()) else None


BENCHMARK = Benchmark(
    module="batchd.bench.adaptive",
    doc=adaptive.__doc__,
    stem=STEM,
    defaults=Options(),
    quick=QUICK,
    flags={
        "models": Flag("which models", choices=MODELS),
        "repeats": Flag("interleaved repeats", minimum=1),
        "duration_s": Flag("measured seconds per open loop", above=0),
        "arrivals": Flag("how arrivals are spaced", choices=("poisson", "uniform")),
        "fractions": Flag("open-loop rates, as shares of capacity", above=0, maximum=2),
        "windows_ms": Flag("the fixed windows", minimum=0),
        "burst_cycles": Flag("on/off cycles of the bursty load", minimum=1),
    },
    measure=measure,
    markdown=to_markdown,
    results=Report,
    chart=draw_chart,
    failure=failure,
)

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
