"""What the adaptive benchmark sends: its models, subjects and loads, the options, and when each
request is due (steady, Poisson or evenly spaced, or in bursts)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from batchd.bench.kit.arrivals import poisson, uniform

SHARED_DEVICE = "costcurve-shared"
MODELS = ("costcurve", SHARED_DEVICE, "minilm")
TITLES = {
    "costcurve": "Cost-curve handler, one batch at a time",
    SHARED_DEVICE: "Cost-curve handler, two batch slots on one device",
    "minilm": "MiniLM-L6 embeddings (CPU)",
}
# max_concurrent_batches per model: two slots that share one device (batches take turns on it)
# are where a window can pay, since a small batch sent beside a running one only wastes the device.
SLOTS = {SHARED_DEVICE: 2}
BURSTY = "bursty"
ADAPTIVE = "adaptive"
MAX_CONNECTIONS = 1024  # the bursty load's backlog holds a few hundred requests open at once


@dataclass(frozen=True)
class Options:
    models: tuple[str, ...] = MODELS
    fractions: tuple[float, ...] = (0.1, 0.5, 0.8, 0.95)  # open-loop rates, of capacity
    windows_ms: tuple[float, ...] = (0.0, 2.0, 10.0, 50.0)
    repeats: int = 3
    duration_s: float = 10.0  # measured, per open-loop run ...
    min_requests: int = 600  # ... longer where it would measure fewer (a p99 needs a few hundred)
    warmup_s: float = 2.0  # at the run's rate, before the measured part
    burst_fraction: float = 1.2
    burst_on_s: float = 2.0
    burst_off_s: float = 2.0
    burst_cycles: int = 4
    capacity_runs: int = 3
    capacity_s: float = 3.0
    capacity_warmup_s: float = 1.0  # before the first capacity run; half of it before each later one
    capacity_clients: int = 64
    objective_factor: float = 2.0  # the adaptive objective: this many full batches at capacity
    max_batch_size: int = 32
    alpha_s: float = 0.020  # the cost curve: alpha + beta * n seconds per batch of n
    beta_s: float = 0.001
    arrivals: str = "poisson"  # or "uniform" (evenly spaced)
    sample_s: float = 0.2  # /metrics sampling during every run
    grace_s: float = 15.0  # answers later than this after the last arrival are given up
    pause_s: float = 0.5  # between runs
    seed: int = 12

    @property
    def subjects(self) -> tuple[str, ...]:
        return (*(window_subject(ms) for ms in self.windows_ms), ADAPTIVE)

    @property
    def loads(self) -> tuple[str, ...]:
        return (*(load_name(f) for f in self.fractions), BURSTY)

    @property
    def burst_period_s(self) -> float:
        return self.burst_on_s + self.burst_off_s


# Smoke-sized: every subject, load and figure, each for a moment (the test checks the report's
# shape, not the figures). The capacity run stays long enough for an estimate near the curve's;
# the bursts are shorter but steeper, so that each still leaves a backlog of a quarter of a
# second of capacity (a full-sized one leaves 0.4 s), where a queue limit or a slow drain shows;
# and /metrics is sampled often enough that the bursty load's series still has some twenty samples.
QUICK = Options(
    models=("costcurve",),
    repeats=1,
    duration_s=0.25,
    min_requests=0,
    warmup_s=0.1,
    burst_fraction=2.0,
    burst_on_s=0.25,
    burst_off_s=0.25,
    burst_cycles=2,
    capacity_runs=1,
    capacity_s=0.5,
    capacity_warmup_s=0.25,
    sample_s=0.05,
    grace_s=10.0,
    pause_s=0.05,
)


def window_subject(ms: float) -> str:
    return f"{ms:g} ms"


def load_name(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def is_cost_curve(model: str) -> bool:
    return model.startswith("costcurve")


@dataclass(frozen=True)
class Schedule:
    """When each request is due (seconds from the start); those due before `measure_from_s` warm up."""

    dues: tuple[float, ...]
    measure_from_s: float
    measured_s: float  # the length of the measured part


def arrivals_between(start: float, end: float, rate: float, rng: random.Random, arrivals: str) -> list[float]:
    """Arrival times in [start, end): a Poisson process at `rate`, or evenly spaced from `start`."""
    if arrivals == "uniform":
        return uniform(start, end, rate)
    return poisson(start, end, rate, rng)


def steady(rate: float, warmup_s: float, duration_s: float, rng: random.Random, arrivals: str) -> Schedule:
    dues = arrivals_between(0.0, warmup_s + duration_s, rate, rng, arrivals)
    return Schedule(tuple(dues), warmup_s, duration_s)


def bursty(rate: float, options: Options, rng: random.Random) -> Schedule:
    """`rate` for burst_on_s, nothing for burst_off_s, burst_cycles times; all of it measured."""
    dues: list[float] = []
    for cycle in range(options.burst_cycles):
        start = cycle * options.burst_period_s
        dues += arrivals_between(start, start + options.burst_on_s, rate, rng, options.arrivals)
    return Schedule(tuple(dues), 0.0, options.burst_cycles * options.burst_period_s)


def schedule_for(load: str, capacity: float, options: Options, rng: random.Random) -> Schedule:
    if load == BURSTY:
        return bursty(options.burst_fraction * capacity, options, rng)
    rate = float(load.removesuffix("%")) / 100 * capacity
    duration_s = max(options.duration_s, options.min_requests / rate)
    return steady(rate, options.warmup_s, duration_s, rng, options.arrivals)
