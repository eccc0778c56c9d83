"""What tracing.json holds (frozen dataclasses), and the figures the report quotes: pure functions
over the rounds, so that they can be checked on synthetic data."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from batchd.bench.kit.goals import Goal, at_least
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import within_repeats
from batchd.bench.kit.stats import median
from batchd.bench.tracing.options import MODES, RPS_GOALS

OFF = MODES[0]


@dataclass(frozen=True)
class Round:
    """One closed loop through one setting's router, to its replica of one model."""

    model: str
    mode: str  # "off" | "100%" | "1%"
    repeat: int
    clients: int
    requests: int  # answered 200 within the measured window
    errors: int
    rps: float
    p50_ms: float
    p99_ms: float
    router_cpu_us: float  # each process's CPU over the window, per request answered
    replica_cpu_us: float
    backend_cpu_us: float  # Jaeger's (on this machine here; elsewhere in a cluster)


@dataclass(frozen=True)
class Stored:
    """What Jaeger holds of one traced setting, read back through its query API."""

    model: str
    mode: str
    requests: int  # sent through that setting's router, warm-ups included
    traces: int  # of its replica's service (1%); at 100%, the marker trace's spans
    services: list[str]  # the marker trace's services (100%)


@dataclass(frozen=True)
class SpanCost:
    """CPU per request's two spans, and per span encoded, each way, one value per round (us)."""

    sdk_request_us: list[float]
    own_request_us: list[float]
    sdk_encode_us: list[float]
    own_encode_us: list[float]


@dataclass(frozen=True)
class Results:
    meta: RunRecord
    options: dict[str, Any]
    rounds: list[Round] = field(default_factory=list)
    stored: list[Stored] = field(default_factory=list)
    spans: SpanCost | None = None


@dataclass(frozen=True)
class ModeFigures:
    """One model under one setting: medians over repeats, and ratios to tracing off in the same
    repeat (their median)."""

    model: str
    mode: str
    repeats: int
    rps: float
    rps_ratio: float
    p50_ms: float
    router_cpu_us: float
    replica_cpu_us: float
    router_cpu_ratio: float
    replica_cpu_ratio: float
    backend_cpu_us: float


def _paired(rounds: list[Round], model: str, mode: str, figure: str) -> list[float]:
    """Per repeat, `figure` of `mode` over tracing off's, both of `model`."""
    of_model = [r for r in rounds if r.model == model]
    return within_repeats(of_model, lambda r: (r.mode, r.repeat), mode, OFF, lambda r: getattr(r, figure))


def figures(results: Results) -> list[ModeFigures]:
    out = []
    models = list(dict.fromkeys(r.model for r in results.rounds))
    for model in models:
        for mode in MODES:
            rounds = [r for r in results.rounds if r.model == model and r.mode == mode]
            if not rounds:
                continue
            out.append(
                ModeFigures(
                    model,
                    mode,
                    len(rounds),
                    median([r.rps for r in rounds]),
                    median(_paired(results.rounds, model, mode, "rps")),
                    median([r.p50_ms for r in rounds]),
                    median([r.router_cpu_us for r in rounds]),
                    median([r.replica_cpu_us for r in rounds]),
                    median(_paired(results.rounds, model, mode, "router_cpu_us")),
                    median(_paired(results.rounds, model, mode, "replica_cpu_us")),
                    median([r.backend_cpu_us for r in rounds]),
                )
            )
    return out


def goals(results: Results) -> list[Goal]:
    """Each model's requests/s at each sampling ratio against its goal."""
    found = {(f.model, f.mode): f.rps_ratio for f in figures(results)}
    return [
        at_least(
            f"{model}, {mode} sampling: >= {goal:g}x the requests/s of tracing off",
            found.get((model, mode), math.nan),
            goal,
        )
        for model in dict.fromkeys(r.model for r in results.rounds)
        for mode, goal in RPS_GOALS.items()
    ]


def failure(results: Results) -> str | None:
    """Why a run measured nothing it can stand behind: no rounds, or rounds that saw errors."""
    if not results.rounds:
        return "no round was measured"
    failed = [f"{r.model} {r.mode} #{r.repeat}: {r.errors} errors" for r in results.rounds if r.errors]
    if failed:
        return "; ".join(failed)
    return None
