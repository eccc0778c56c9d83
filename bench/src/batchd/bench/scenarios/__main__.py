"""The main scenarios (`make bench`, `python -m batchd.bench`): run them, write JSON and markdown.

    python -m batchd.bench                       # every scenario, 3 repeats (about 10 minutes)
    python -m batchd.bench --quick               # smoke-sized: one load, one repeat, short runs
    python -m batchd.bench --scenarios minilm --repeats 5

Results go to bench/results/latest.json and latest.md (or --output-dir). The exit status is
non-zero when a scenario could not be measured (a server failed to start, a request errored
in every run); missed performance targets are reported, not failed on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import platform
import sys

from batchd.bench.kit.command import Benchmark, Flag, Run, main
from batchd.bench.scenarios import analysis, catalog, harness, report
from batchd.bench.scenarios.results import BenchRecord, BenchResult, ScenarioResult


def versions() -> dict[str, str]:
    import importlib.metadata as metadata

    found = {"python": platform.python_version()}
    for package in ("torch", "transformers", "uvicorn", "fastapi"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            found[package] = metadata.version(package)
    return found


def measure(run: Run[harness.Options]) -> BenchResult:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    options, every = run.options, catalog.all_scenarios()
    meta = BenchRecord(
        **dataclasses.asdict(run.record),
        versions=versions(),
        repeats=options.repeats,
        duration_s=options.duration_s,
        options=dataclasses.asdict(options),
    )
    measured: dict[str, ScenarioResult] = {}
    failures: dict[str, str] = {}
    for name in options.scenarios:
        try:
            measured[name] = harness.run_scenario(every[name], options, run.workdir / name)
        except Exception as error:  # one broken scenario must not hide the others' numbers
            logging.exception("scenario %s failed", name)
            failures[name] = f"{type(error).__name__}: {error}"
    return BenchResult(meta, measured, failures, analysis.check_targets(measured))


def failure(result: BenchResult) -> str | None:
    return f"scenario(s) failed: {', '.join(result.failures)}" if result.failures else None


BENCHMARK = Benchmark(
    module="batchd.bench",
    doc=__doc__,
    stem="latest",
    defaults=harness.Options(),
    quick=harness.Options(
        repeats=1, duration_s=1.0, warmup_s=0.2, concurrencies=(8,), ceiling_duration_s=1.0
    ),
    flags={
        "scenarios": Flag("which scenarios", choices=tuple(sorted(catalog.all_scenarios()))),
        "repeats": Flag("interleaved repeats per point", minimum=1),
        "duration_s": Flag("seconds per load run", above=0),
        "concurrencies": Flag("closed-loop clients", minimum=1),
    },
    measure=measure,
    markdown=report.to_markdown,
    results=BenchResult,
    failure=failure,
    workdir_help="keep manifests, models and logs here",
)

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
