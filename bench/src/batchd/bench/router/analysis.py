"""Figures from what a run saw: pure functions over counts and outcomes, so that the report's
numbers can be checked on synthetic data."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from batchd.bench.kit.stats import percentile
from batchd.testing.traffic import Outcome, unanswered

# A replica "takes its share" once, over one window, it answers at least this fraction of an
# even share (1 / replicas): a replica that gets requests only through connections opened before
# it existed stays near zero; one that requests are balanced to reaches it within a window.
SHARE_FRACTION = 0.5


def window_shares(
    samples: Sequence[tuple[float, Sequence[float]]], window_s: float
) -> tuple[list[float], list[list[float]]]:
    """Each replica's share of the answers over the `window_s` before each sample.

    `samples` are (seconds, answers so far per replica), in time order. A window with no answer
    at all has NaN shares. Returns the sample times (from the first full window) and, per
    replica, its share at each of them."""
    if not samples:
        return [], []
    count = len(samples[0][1])
    times: list[float] = []
    shares: list[list[float]] = [[] for _ in range(count)]
    start = 0
    for t, totals in samples:
        while start + 1 < len(samples) and samples[start + 1][0] <= t - window_s:
            start += 1
        t0, before = samples[start]
        if t - t0 < window_s * 0.999:
            continue
        deltas = [after - earlier for after, earlier in zip(totals, before, strict=True)]
        total = sum(deltas)
        times.append(t)
        for index, delta in enumerate(deltas):
            shares[index].append(delta / total if total > 0 else math.nan)
    return times, shares


def settle_s(times: Sequence[float], shares: Sequence[float], since: float, replicas: int) -> float | None:
    """Seconds from `since` (the replica ready) to the end of the first window in which it answered
    at least SHARE_FRACTION of an even share; None if none did."""
    wanted = SHARE_FRACTION / replicas
    for t, share in zip(times, shares, strict=True):
        if t >= since and not math.isnan(share) and share >= wanted:
            return t - since
    return None


def overall_shares(first: Sequence[float], last: Sequence[float]) -> list[float]:
    """Each replica's share of every answer between two readings of its answer count."""
    deltas = [after - before for after, before in zip(last, first, strict=True)]
    total = sum(deltas)
    return [delta / total if total > 0 else math.nan for delta in deltas]


def statuses(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """Outcomes by HTTP status, "None" for no answer."""
    return dict(sorted(Counter(str(outcome.status) for outcome in outcomes).items()))


def lost(outcomes: Sequence[Outcome]) -> int:
    """Outcomes a client could not act on: no answer, or an error that is not a retry hint."""
    return len(unanswered(outcomes))


def latency_ms(outcomes: Sequence[Outcome], q: float) -> float:
    """The q-th percentile latency of the 200s, in ms (a 503 answered at once is no latency)."""
    return percentile([outcome.latency_s for outcome in outcomes if outcome.status == 200], q) * 1000


def first_at_least(times: Sequence[float], values: Sequence[float], threshold: float) -> float | None:
    """The first time at which `values` reaches `threshold`; None if it never does."""
    for t, value in zip(times, values, strict=True):
        if value >= threshold:
            return t
    return None
