"""The loads: when each request is due, steady (Poisson or evenly spaced) or in bursts."""

from __future__ import annotations

import random
from dataclasses import dataclass

from batchd.bench.adaptive.options import BURSTY, Options
from batchd.bench.kit.arrivals import poisson, uniform


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
