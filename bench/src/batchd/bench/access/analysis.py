"""What access.json holds (frozen dataclasses), and the figures the report quotes: pure functions
over the rounds, so that they can be checked on synthetic data."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

from batchd.bench.access.options import ADDED_CPU_GOAL_US, OFF, PROBE_GOAL, REVIEWS_PER_TTL_GOAL, WAYS
from batchd.bench.kit.goals import Goal, at_most
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.repeats import within_repeats
from batchd.bench.kit.stats import median, ratio


@dataclass(frozen=True)
class Round:
    """One way in, measured once: latency with one request in flight, CPU with `in_flight`."""

    way: str  # "off" | "key" | "token"
    repeat: int
    requests: int  # answered 200 in the measured windows
    errors: int
    p50_ms: float
    p99_ms: float
    rps: float  # with `in_flight` in flight
    router_cpu_us: float  # the router's CPU over that window, per request sent


@dataclass(frozen=True)
class Reviews:
    """The router's TokenReviews, as the API server's audit log has them, over the token's rounds."""

    count: int
    minutes: float  # from the first token round's start to the last one's end
    ttl_s: float  # how long the router keeps an allowed review


@dataclass(frozen=True)
class Probe:
    """Tenant B sending prompts tenant A cached (claiming A in every header), against its own fresh
    ones of the same length: each try's answer time (one new token), and how often a cache hit."""

    tries: int
    controls: int  # tries where A's own second send hit its cache (the positive control)
    hits: int  # tries where B's probe hit anything
    probe_s: list[float]
    fresh_s: list[float]


@dataclass(frozen=True)
class Results:
    meta: RunRecord
    options: dict[str, Any]
    rounds: list[Round] = field(default_factory=list)
    reviews: Reviews | None = None
    probe: Probe | None = None
    decision_us: dict[str, list[float]] = field(default_factory=dict)  # way -> CPU per request, by round


def decision_added_us(results: Results, way: str) -> float:
    """The CPU per request `way`'s decision adds to access off's (medians of the rounds)."""
    found = results.decision_us
    if not found.get(way) or not found.get(OFF):
        return math.nan
    return median(found[way]) - median(found[OFF])


def probe_kept_apart(probe: Probe) -> bool:
    """Every positive control hit, no probe did, and probes took as long as fresh prompts."""
    return probe.hits == 0 and probe.controls == probe.tries and probe_ratio(probe) >= PROBE_GOAL


def probe_ratio(probe: Probe) -> float:
    """B's probe over its fresh prompt: the median answer time of each."""
    return ratio(median(probe.probe_s), median(probe.fresh_s))


@dataclass(frozen=True)
class WayFigures:
    """One way in: medians over repeats, and the CPU it adds to access off in the same repeat."""

    way: str
    repeats: int
    p50_ms: float
    p99_ms: float
    rps: float
    router_cpu_us: float
    added_cpu_us: float  # median over repeats of (this way's - off's); 0 for off


def _added(rounds: list[Round], way: str) -> list[float]:
    return within_repeats(
        rounds, lambda r: (r.way, r.repeat), way, OFF, lambda r: r.router_cpu_us, operator.sub
    )


def figures(results: Results) -> list[WayFigures]:
    out = []
    for way in WAYS:
        rounds = [r for r in results.rounds if r.way == way]
        if rounds:
            out.append(
                WayFigures(
                    way,
                    len(rounds),
                    median([r.p50_ms for r in rounds]),
                    median([r.p99_ms for r in rounds]),
                    median([r.rps for r in rounds]),
                    median([r.router_cpu_us for r in rounds]),
                    0.0 if way == OFF else median(_added(results.rounds, way)),
                )
            )
    return out


def reviews_per_ttl(reviews: Reviews) -> float:
    """TokenReviews per review TTL over the token's rounds (one token): at least one TTL's worth."""
    ttls = max(1.0, reviews.minutes * 60 / reviews.ttl_s)
    return reviews.count / math.ceil(ttls)


def goals(results: Results) -> list[Goal]:
    found = [
        at_most(
            f"{what}: at most {ADDED_CPU_GOAL_US:g} us of router CPU per request added",
            decision_added_us(results, way),
            ADDED_CPU_GOAL_US,
        )
        for way, what in (("key", "an API key"), ("token", "a token whose review is cached"))
    ]
    probe = results.probe
    kept_apart = f"another tenant's cached prompt: no hit, and no sooner than {PROBE_GOAL:g}x a fresh one"
    found.append(
        Goal(kept_apart, math.nan, PROBE_GOAL, None)
        if probe is None
        else Goal(kept_apart, probe_ratio(probe), PROBE_GOAL, probe_kept_apart(probe))
    )
    reviews = results.reviews
    found.append(
        at_most(
            f"at most {REVIEWS_PER_TTL_GOAL} TokenReview per token per TTL",
            math.nan if reviews is None else reviews_per_ttl(reviews),
            REVIEWS_PER_TTL_GOAL,
        )
    )
    return found


def failure(results: Results) -> str | None:
    """Why a run measured nothing it can stand behind: no rounds, or rounds that saw errors."""
    if not results.rounds:
        return "no round was measured"
    failed = [f"{r.way} #{r.repeat}: {r.errors} errors" for r in results.rounds if r.errors]
    return "; ".join(failed) if failed else None
