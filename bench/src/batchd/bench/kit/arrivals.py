"""When requests arrive in an open loop: a Poisson process, or evenly spaced.

Evenly spaced arrivals never bunch, which hides what a batch window is for; a seeded Poisson
process bunches as independent users do, and gives every subject of a repeat the same times.
"""

from __future__ import annotations

import math
import random


def poisson(start: float, end: float, rate: float, rng: random.Random) -> list[float]:
    """Arrival times in [start, end) of a Poisson process at `rate` a second."""
    dues: list[float] = []
    t = start + rng.expovariate(rate)
    while t < end:
        dues.append(t)
        t += rng.expovariate(rate)
    return dues


def uniform(start: float, end: float, rate: float) -> list[float]:
    """Arrival times in [start, end), every 1/rate seconds from `start`."""
    return [start + i / rate for i in range(math.ceil((end - start) * rate - 1e-9))]
