"""A canary step judged from what the replicas of each revision measure: pure functions.

Every replica counts its answers by outcome and their durations in buckets
(`batchd_request_duration_seconds`, on its own `/metrics`). The operator reads each replica's
counts, takes the difference from the start of the step, sums the replicas of each revision (by
the revision label on the pod, never by which Deployment made it), and
compares the canary with the stable revision over the same window: its error rate against
`max_error_rate`, its p99 against `max_p99_ratio` times the stable p99. No metrics system sits in
between, and the window is exactly the step.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from batchd.api.spec import CanaryAnalysis

DURATIONS = "batchd_request_duration_seconds"
# Outcomes the revision answers for: a success, or a failure it is responsible for: the model
# raised on a batch (500) or on an item alone (422, `item_failed`), or did not answer in time.
# The caller's malformed requests (400 and 404, `invalid`: a body that does not parse, an unknown
# model or class) are counted nowhere, neither as failures nor as answers: a caller could
# otherwise roll back a good canary with bad input, or dilute a bad canary's failures (or raise
# the stable one's) to mask it. Refusals before queueing and clients that left are not the
# revision's doing either. Items that fail on every revision (the router splits at random, and
# only the router reaches the replicas) fail on the stable one as often, so the canary is judged
# on the failures beyond the stable revision's share.
ANSWERED = ("success", "error", "timeout", "item_failed")
FAILED = ("error", "timeout", "item_failed")
# The p99 of fewer answers than this is their slowest one or two: latency is judged only once
# both revisions have answered this many in the window (the stable one none at a step of 100%).
MIN_LATENCY_ANSWERS = 50


@dataclass(frozen=True)
class Answers:
    """Answers counted so far (by one replica, or summed): how many, how many failed, and their
    durations as cumulative buckets (upper bound in seconds -> answers at most that long)."""

    answered: int = 0
    failed: int = 0
    buckets: Mapping[float, float] = field(default_factory=dict)

    @property
    def error_rate(self) -> float:
        return self.failed / self.answered if self.answered else 0.0

    def p99(self) -> float | None:
        return quantile(0.99, self.buckets)


NO_ANSWERS = Answers()


def parse_answers(text: str) -> Answers:
    """A replica's answers so far, from its `/metrics` text; ValueError when it has none to read."""
    answered = failed = 0
    buckets: dict[float, float] = {}
    found = False
    for family in text_string_to_metric_families(text):
        if family.name != DURATIONS:
            continue
        found = True
        for sample in family.samples:
            outcome = sample.labels.get("outcome")
            if outcome not in ANSWERED:
                continue
            if sample.name == f"{DURATIONS}_count":
                answered += int(sample.value)
                failed += int(sample.value) if outcome in FAILED else 0
            elif sample.name == f"{DURATIONS}_bucket":
                bound = float(sample.labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    if not found:
        raise ValueError(f"no {DURATIONS} in the replica's metrics")
    return Answers(answered, failed, buckets)


def since(now: Answers, start: Answers | None) -> Answers:
    """What one replica answered after `start` (None: it was not there at the step's start, so all
    of it). `start` is of the same replica (`ReplicaPod.identity`: a restarted one is another), so
    its counts only rise; a count that seems to fall (a read crossing a restart the pod's status
    has not shown yet) is taken as nothing new, never as a negative."""
    if start is None:
        return now
    return Answers(
        max(0, now.answered - start.answered),
        max(0, now.failed - start.failed),
        {bound: max(0.0, count - start.buckets.get(bound, 0.0)) for bound, count in now.buckets.items()},
    )


def total(answers: Iterable[Answers]) -> Answers:
    answered = failed = 0
    buckets: dict[float, float] = {}
    for one in answers:
        answered += one.answered
        failed += one.failed
        for bound, count in one.buckets.items():
            buckets[bound] = buckets.get(bound, 0.0) + count
    return Answers(answered, failed, buckets)


def step_starts(
    readings: Mapping[str, Answers], canary: Collection[str], first_step: bool
) -> dict[str, Answers]:
    """Each replica's answers at a step's first look, which the step's window leaves out; none for
    the canary's replicas in the first step: all they answered is this revision's."""
    return {
        replica: answers for replica, answers in readings.items() if not (first_step and replica in canary)
    }


def windows(
    readings: Mapping[str, Answers],
    starts: Mapping[str, Answers],
    canary: Collection[str],
    stable: Collection[str],
) -> tuple[Answers, Answers]:
    """(canary, stable): what each revision's replicas answered since the step's start. Replicas
    of any other revision (a canary this rollout replaced) are in neither."""

    def summed(replicas: Collection[str]) -> Answers:
        return total(
            since(answers, starts.get(replica))
            for replica, answers in readings.items()
            if replica in replicas
        )

    return summed(canary), summed(stable)


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """The q-quantile of cumulative buckets, interpolated within its bucket as Prometheus'
    `histogram_quantile` does; None without observations."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # past the highest finite bound: that bound is all we know
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


@dataclass(frozen=True)
class Verdict:
    """A judgement of the step so far: `failure` says what failed (None: nothing), `enough` that
    the canary answered the minimum; `figures` is the line the status and events carry."""

    failure: str | None
    enough: bool
    figures: str


def judge(canary: Answers, stable: Answers, analysis: CanaryAnalysis) -> Verdict:
    """The canary's window against the analysis and the stable revision's same window."""
    canary_p99, stable_p99 = canary.p99(), stable.p99()
    figures = (
        f"canary {canary.failed}/{canary.answered} failed ({canary.error_rate:.1%}), "
        f"p99 {_ms(canary_p99)}; stable {stable.failed}/{stable.answered} failed, p99 {_ms(stable_p99)}"
    )
    if canary.answered < analysis.min_requests:
        return Verdict(None, False, figures)
    # A step passes only once its latency could be judged too (the stable revision may have no
    # answers at all: a step of 100%).
    latency_judged = min(canary.answered, stable.answered) >= MIN_LATENCY_ANSWERS
    enough = latency_judged or (canary.answered >= MIN_LATENCY_ANSWERS and not stable.answered)
    excess = canary.error_rate - (stable.error_rate if stable.answered else 0.0)
    if excess > analysis.max_error_rate:
        return Verdict(
            f"error rate {canary.error_rate:.1%} is {excess:.1%} above the stable revision's, more than "
            f"max_error_rate {analysis.max_error_rate:.1%} ({figures})",
            True,
            figures,
        )
    if canary_p99 and stable_p99 and latency_judged:
        ratio = canary_p99 / stable_p99
        if ratio > analysis.max_p99_ratio:
            return Verdict(
                f"p99 {ratio:.2f} times the stable revision's is above max_p99_ratio "
                f"{analysis.max_p99_ratio:g} ({figures})",
                True,
                figures,
            )
    return Verdict(None, enough, figures)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"
