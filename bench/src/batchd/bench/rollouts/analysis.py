"""What rollouts.json holds, and how a subject's run becomes it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from batchd.bench.kit.goals import Goal, at_least, at_most
from batchd.bench.kit.records import RunRecord
from batchd.bench.kit.stats import p99_ms, ratio
from batchd.bench.rollouts.workload import Options
from batchd.testing.traffic import Outcome


@dataclass(frozen=True)
class SubjectRun:
    """One subject, one repeat. Times are seconds after the ship."""

    requests_after: int
    failed_after: int
    last_failure_s: float | None  # None: none failed
    still_failing: bool  # failures in the run's last 10 s: clients still see them
    steady_p99_ms: float
    rollout_p99_ms: float
    ended: str  # the rollout's phase at the end
    # The timeline: per second after the ship, the error rate clients saw, and the canary's share.
    seconds: list[float] = field(default_factory=list)
    error_rate: list[float] = field(default_factory=list)
    share_s: list[float] = field(default_factory=list)
    share_percent: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Results:
    meta: RunRecord
    options: Options
    runs: dict[str, list[SubjectRun]]  # by subject, one per repeat


def subject_run(
    outcomes: list[Outcome], shipped_s: float, shares: list[tuple[float, float]], ended: str
) -> SubjectRun:
    """`outcomes` on the traffic's clock, the ship at `shipped_s`; `shares`: (seconds after the
    ship, canary percent) as sampled."""
    before = [o for o in outcomes if o.sent_s < shipped_s]
    after = [o for o in outcomes if o.sent_s >= shipped_s]
    failed = [o.sent_s - shipped_s for o in after if o.status != 200]
    end_s = max((o.sent_s - shipped_s for o in after), default=0.0)
    buckets = int(end_s) + 1
    sent, bad = [0] * buckets, [0] * buckets
    for outcome in after:
        second = int(outcome.sent_s - shipped_s)
        sent[second] += 1
        bad[second] += outcome.status != 200
    return SubjectRun(
        requests_after=len(after),
        failed_after=len(failed),
        last_failure_s=max(failed) if failed else None,
        still_failing=any(at > end_s - 10 for at in failed),
        steady_p99_ms=p99_ms([o.latency_s for o in before if o.status == 200]),
        rollout_p99_ms=p99_ms([o.latency_s for o in after if o.status == 200]),
        ended=ended,
        seconds=[float(second) for second in range(buckets)],
        error_rate=[b / s if s else math.nan for b, s in zip(bad, sent, strict=True)],
        share_s=[at for at, _ in shares],
        share_percent=[percent for _, percent in shares],
    )


def goals(results: Results) -> list[Goal]:
    rolling = sum(run.failed_after for run in results.runs["rolling"])
    canary = sum(run.failed_after for run in results.runs["canary"])
    good = results.runs["canary-good"]
    # A p99 that was not measured (NaN) misses its bound: the comparison is false.
    p99_kept = all(run.rollout_p99_ms <= 1.2 * run.steady_p99_ms for run in good)
    worst_p99 = max((ratio(run.rollout_p99_ms, run.steady_p99_ms) for run in good), default=0.0)
    return [
        at_least(
            "the canary gives at least 20 times fewer failed requests than the rolling update",
            rolling / max(canary, 1),
            20,
        ),
        at_most("a good revision through the canary loses nothing", sum(run.failed_after for run in good), 0),
        Goal("its p99 during the rollout within 1.2x the p99 before it", worst_p99, 1.2, p99_kept),
    ]
