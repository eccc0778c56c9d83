"""What router.json holds (frozen dataclasses, part by part), and figures from what a run saw: pure
functions over counts and outcomes, so that the report's numbers can be checked on synthetic data."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.stats import percentile
from batchd.testing.traffic import Outcome, unanswered


@dataclass(frozen=True)
class StepRun:
    """One path through the keep-alive step (1 -> `replicas` replicas while the load runs)."""

    path: str  # "service" (connections balanced) | "router"
    repeat: int
    requests: int
    statuses: dict[str, int]  # by HTTP status; "None" for no answer within the client's timeout
    unanswered: int  # neither a 2xx nor a 503/429 with Retry-After
    p99_ms: float  # of the 200s
    shares: list[float]  # each replica's share of the answers over the whole run
    settle_s: list[float | None]  # each added replica: from ready to its share (None: never)
    series: dict[str, list[float]]  # "t" and "r0".."rN": each replica's share per window


@dataclass(frozen=True)
class SteadyRun:
    """Open loop at a fixed utilisation of the replicas behind one path."""

    subject: str  # "one replica" (direct) | "service" | "router"
    repeat: int
    replicas: int
    rate_rps: float
    requests: int
    ok: int
    refused_503: int
    unanswered: int
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True)
class CostRound:
    """One round of the trivial adder, direct then through the router (or the other way round)."""

    repeat: int
    direct_p50_ms: float
    router_p50_ms: float
    direct_p99_ms: float
    router_p99_ms: float
    direct_rps: float  # with `in_flight` requests in flight
    router_rps: float
    router_cpu_us: float  # the router process's CPU per request, from /proc


@dataclass(frozen=True)
class ZeroRun:
    """One cold start: a deployment at zero replicas gets traffic; the router holds it."""

    repeat: int
    requests: int
    ok: int
    lost: int  # not answered 200 though sent within the hold bound
    load_s: float  # the replica's own start: process started -> ready
    first_answer_s: float  # the first request: sent -> answered
    noticed_s: float  # first request sent -> the stand-in saw it held
    ready_s: float  # first request sent -> the replica ready
    released_s: float  # replica's slice published -> first answer
    peak_held: int
    series: dict[str, list[float]]  # "t", "held", "answered" (per sample)


@dataclass(frozen=True)
class Part:
    """What every part's result starts with: its run and the options it ran with."""

    meta: RunRecord
    options: dict[str, float]


@dataclass(frozen=True)
class KeepaliveResult(Part):
    step: list[StepRun]
    steady: list[SteadyRun]


@dataclass(frozen=True)
class CostResult(Part):
    rounds: list[CostRound]


@dataclass(frozen=True)
class ZeroResult(Part):
    runs: list[ZeroRun]


@dataclass(frozen=True)
class Results:
    """router.json: the parts run separately (or together) and report together."""

    keepalive: KeepaliveResult | None = None
    cost: CostResult | None = None
    zero: ZeroResult | None = None


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
