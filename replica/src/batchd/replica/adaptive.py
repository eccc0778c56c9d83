"""Adaptive batching: each batch's wait and size chosen from a latency objective, not a fixed window.

With `batching.latency_objective_s` set, the batcher asks `plan()` before each batch. Two things
are learned as the replica runs:
- what a batch costs: `CostModel`, a line through (batch size, seconds) fitted by least squares
  over the recent batches that ran alone (beside another, a batch's time includes its wait for
  the device), forgetting old ones;
- how fast items arrive: `ArrivalRate`, a count decayed over a second (so a change of load is
  followed within seconds).

The rule: waiting for company only pays when the model could not keep up otherwise.
- The model idle (no batch running): the batch leaves at once with what is queued. What arrives
  while it runs forms the next batch, so batches grow with the load by themselves. With one batch
  at a time, serving whenever the model is free is what queueing theory finds best when serving
  has no cost of its own (Deb and Serfozo, 1973), and in `python -m batchd.bench.adaptive` no
  fixed window beat it at any load.
- Another batch running and a slot free: a batch now would share the device with it (batches on
  one GPU take turns), so it is sized as if the model ran one batch at a time. A batch of the n
  items already queued keeps up when the model serves them at least as fast as they come
  (n / cost(n) >= rate, with some headroom): then it leaves at once. Otherwise it
  waits until enough items have arrived to keep up, or the running batch ends, but never past the
  moment its oldest item would miss the objective (arrival + objective - cost of the batch).
- A full batch, or an overload (even a full batch cannot keep up), leaves at once.

The arrival rate is the decayed count, or the rate the queue itself shows when that is higher:
at the start of a burst the count lags, but the items queued since the oldest one already show
how fast they come.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

# Batches are sized to serve this much more than the arrival rate: without headroom a queue at
# exactly the model's pace grows on every burst.
HEADROOM = 1.2
# Each batch counts this much less in the cost fit than the one after it: the last 20 or so batches
# matter, so a model that warms up or a GPU that throttles is followed within a few dozen.
FORGETTING = 0.95
# The arrival rate is counted over about this many seconds.
RATE_WINDOW_S = 1.0


class CostModel:
    """Seconds a batch of `size` items takes: alpha + beta * size, fitted on recent batches."""

    def __init__(self) -> None:
        self._weight = self._sum_b = self._sum_bb = self._sum_t = self._sum_bt = 0.0
        self.batches = 0

    def observe(self, size: int, seconds: float) -> None:
        self._weight = FORGETTING * self._weight + 1.0
        self._sum_b = FORGETTING * self._sum_b + size
        self._sum_bb = FORGETTING * self._sum_bb + size * size
        self._sum_t = FORGETTING * self._sum_t + seconds
        self._sum_bt = FORGETTING * self._sum_bt + size * seconds
        self.batches += 1

    @property
    def fitted(self) -> tuple[float, float] | None:
        """(alpha, beta): fixed seconds per batch and seconds per item; None until it has seen
        two batch sizes (before that the batcher does what a zero window does)."""
        if self.batches < 2:
            return None
        mean_b = self._sum_b / self._weight
        spread = self._sum_bb / self._weight - mean_b * mean_b
        mean_t = self._sum_t / self._weight
        if spread <= 1e-9:  # one size only: the cost per item is unknown
            return None
        beta = max(0.0, (self._sum_bt / self._weight - mean_b * mean_t) / spread)
        alpha = max(0.0, mean_t - beta * mean_b)
        return alpha, beta

    def seconds(self, size: int) -> float:
        fit = self.fitted
        if fit is None:
            return self._sum_t / self._weight if self._weight else 0.0
        alpha, beta = fit
        return alpha + beta * size


class ArrivalRate:
    """Items a second, decayed exponentially over RATE_WINDOW_S."""

    def __init__(self) -> None:
        self._rate = 0.0
        self._at = 0.0

    def add(self, items: int, now: float) -> None:
        self._rate = self.at(now) + items / RATE_WINDOW_S
        self._at = now

    def at(self, now: float) -> float:
        return self._rate * math.exp(-max(0.0, now - self._at) / RATE_WINDOW_S)


@dataclass(frozen=True)
class Plan:
    go: bool  # dispatch now
    size: int  # the batch to take (now), or to wait for
    wait_until: float  # the latest moment to go, if not now (loop time); each arrival re-plans


def plan(
    *,
    now: float,
    queued: int,
    oldest_arrival: float,
    objective_s: float,
    max_batch_size: int,
    running: int,
    cost: CostModel,
    rate: ArrivalRate,
) -> Plan:
    """The batch to form now, or how long to wait for it (see the module docstring); `running` is
    the number of batches in the model now."""
    if queued >= max_batch_size or running == 0:
        return Plan(True, min(queued, max_batch_size), now)
    fit = cost.fitted  # once per plan, not once per size tried
    if fit is None:
        return Plan(True, queued, now)
    alpha, beta = fit
    arrivals = _arrival_rate(now, queued, oldest_arrival, rate)
    needed = _smallest_keeping_up(arrivals, max_batch_size, alpha, beta)
    if queued >= needed:
        return Plan(True, queued, now)  # keeps up as it is: no wait
    # Wait for `needed` items, but leave in time for the oldest item's objective.
    last_moment = oldest_arrival + objective_s - (alpha + beta * needed)
    if last_moment <= now:
        return Plan(True, queued, now)
    return Plan(False, needed, last_moment)  # arrivals meanwhile bring a new plan


def _arrival_rate(now: float, queued: int, oldest_arrival: float, rate: ArrivalRate) -> float:
    """Items a second: the decayed count, or what the queue shows if more. The count lags a step
    of load by about RATE_WINDOW_S; the items that came since the oldest one show it at once."""
    if queued > 1 and now > oldest_arrival:
        return max(rate.at(now), (queued - 1) / (now - oldest_arrival))
    return rate.at(now)


def _smallest_keeping_up(rate: float, max_batch_size: int, alpha: float, beta: float) -> int:
    """The smallest batch the model serves at HEADROOM times `rate` (batch cost alpha + beta *
    size); the largest when none can."""
    for size in _sizes(max_batch_size):
        if size >= HEADROOM * rate * (alpha + beta * size):
            return size
    return max_batch_size


@functools.lru_cache(maxsize=8)
def _sizes(max_batch_size: int) -> tuple[int, ...]:
    """1..max, every size up to 64 and then a geometric ladder (a plan is computed per arrival;
    the ladder, once per max_batch_size)."""
    sizes = list(range(1, min(max_batch_size, 64) + 1))
    size = 64
    while size < max_batch_size:
        size = min(max_batch_size, int(size * 1.25) + 1)
        sizes.append(size)
    return tuple(sizes)
