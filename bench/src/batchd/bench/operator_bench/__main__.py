"""`python -m batchd.bench.operator_bench`: the command (what it runs: the package's docstring)."""

from __future__ import annotations

import asyncio
import logging
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from batchd.bench import operator_bench
from batchd.bench.kit.command import Benchmark, Flag, Run, main
from batchd.bench.operator_bench.convergence import measure_convergence
from batchd.bench.operator_bench.polling import DEFAULT_POLL_S, run_autoscaling
from batchd.bench.operator_bench.report import to_markdown
from batchd.bench.operator_bench.results import OperatorResult
from batchd.testing.kubernetes.release import installed
from batchd.testing.kubernetes.started import benchmark_control_plane


@dataclass(frozen=True)
class Options:
    repeats: int = 20  # single creates timed one after another
    resources: int = 500  # created at once, to converge
    autoscaled: int = 500  # autoscaled resources whose replicas are polled; 0 skips that part
    replicas_per: int = 4
    steady_s: float = 60.0  # of autoscaling steady state
    window_s: float = 10.0  # CPU is measured in windows this long
    poll_interval_s: float | None = None  # the operator's replica poll interval; None: its own
    log: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "batchd-operator-bench.log")


# Smoke-sized: every phase and figure for a moment. The steady state still spans four windows and
# four polls of every replica; what stays is the cluster's and the operators' start.
QUICK = Options(repeats=2, resources=5, autoscaled=5, steady_s=2.0, window_s=0.5, poll_interval_s=0.5)


def measure(run: Run[Options]) -> OperatorResult:
    options = run.options
    with (
        benchmark_control_plane(run.workdir / "control-plane") as cluster,
        # The chart without its router: the operator's RBAC and environment, run as a process here.
        installed(cluster, run.workdir, {"router": {"enabled": False}}) as release,
    ):
        convergence = asyncio.run(
            measure_convergence(release, options.repeats, options.resources, options.log)
        )
        polling = None
        if options.autoscaled:
            polling = asyncio.run(
                run_autoscaling(
                    release,
                    options.autoscaled,
                    options.replicas_per,
                    options.steady_s,
                    options.window_s,
                    options.poll_interval_s,
                    options.log,
                )
            )
    return OperatorResult(run.record, convergence, polling)


def failure(result: OperatorResult) -> str | None:
    polling = result.autoscaling
    if polling and polling.replicas_polled < polling.replicas:
        return f"only {polling.replicas_polled} of {polling.replicas} replicas were polled"
    return None


BENCHMARK = Benchmark(
    module="batchd.bench.operator_bench",
    doc=operator_bench.__doc__,
    stem="operator",
    defaults=Options(),
    quick=QUICK,
    flags={
        "repeats": Flag("single creates timed one after another", minimum=1),
        "resources": Flag("resources created at once to converge", minimum=1),
        "autoscaled": Flag("autoscaled resources whose replicas are polled; 0 skips it", minimum=0),
        "replicas_per": Flag("replicas of each autoscaled resource", minimum=1),
        "steady_s": Flag("seconds of autoscaling steady state", above=0),
        "window_s": Flag("CPU is measured in windows this long", above=0),
        "poll_interval_s": Flag(
            f"the operator's replica poll interval (its own: {DEFAULT_POLL_S:g} s)", above=0
        ),
        "log": Flag("where the operator's own log goes"),
    },
    measure=measure,
    markdown=to_markdown,
    results=OperatorResult,
    failure=failure,
    log_level=logging.WARNING,
)

if __name__ == "__main__":
    sys.exit(main(BENCHMARK))
