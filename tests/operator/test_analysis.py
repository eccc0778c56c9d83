"""A canary step judged from the replicas' own answer counts: the figures a replica exposes, the
step's window, and the verdict against the stable revision."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from batchd.api.spec import CanaryAnalysis
from batchd.operator import analysis
from batchd.replica.metrics import ReplicaMetrics

ANALYSIS = CanaryAnalysis(min_requests=50, max_error_rate=0.05, max_p99_ratio=1.5)


def exposed(**answers: list[float]) -> analysis.Answers:
    """What the operator reads from a real replica's /metrics after these answers (by outcome)."""
    metrics = ReplicaMetrics("adder", "adder")
    for outcome, durations in answers.items():
        for duration in durations:
            metrics.request_done(outcome, duration)
    return analysis.parse_answers(generate_latest(metrics.registry).decode())


def test_a_replicas_answers_are_read_from_its_metrics_leaving_out_what_it_did_not_answer() -> None:
    answers = exposed(
        success=[0.02] * 90,
        error=[0.01] * 3,
        timeout=[30.0] * 4,
        item_failed=[0.01] * 2,  # the model raised on an item alone (422): the revision's doing
        invalid=[0.01] * 300,  # the callers' 4xx: malformed bodies, an unknown model
        rejected=[0.0] * 50,
        cancelled=[0.0] * 7,
    )
    assert (answers.answered, answers.failed) == (99, 9)
    assert answers.error_rate == pytest.approx(9 / 99)
    p99 = answers.p99()
    assert p99 is not None and 10 <= p99 <= 60  # the timeouts are the slowest percent


def test_the_callers_4xx_neither_roll_back_a_good_canary_nor_mask_a_bad_one() -> None:
    good = exposed(success=[0.02] * 200)
    stable = exposed(success=[0.02] * 200, error=[0.02] * 2)
    # Malformed bodies sent to the canary's Service: no failure of the canary's.
    flooded = analysis.total([good, exposed(invalid=[0.001] * 1000)])
    assert flooded == good
    assert analysis.judge(flooded, stable, ANALYSIS).failure is None
    # A bad canary stays bad whoever floods the stable Service (or the canary's) with bad input.
    bad = exposed(success=[0.02] * 150, error=[0.02] * 50)
    stable_flooded = analysis.total([stable, exposed(invalid=[0.001] * 1000)])
    canary_flooded = analysis.total([bad, exposed(invalid=[0.001] * 1000)])
    verdict = analysis.judge(canary_flooded, stable_flooded, ANALYSIS)
    assert verdict.failure is not None and "error rate 25.0%" in verdict.failure
    # Nor does a flood of fast 4xx make its p99 look better, or a slow 4xx worse.
    slow = exposed(success=[0.02] * 100)
    assert analysis.total([slow, exposed(invalid=[30.0] * 50)]).p99() == slow.p99()


def test_metrics_without_the_answer_histogram_are_refused() -> None:
    with pytest.raises(ValueError, match="batchd_request_duration_seconds"):
        analysis.parse_answers("# nothing here\n")


def test_the_window_is_what_each_replica_answered_since_the_step_began() -> None:
    start = exposed(success=[0.02] * 100, error=[0.02] * 100)
    now = exposed(success=[0.02] * 150, error=[0.02] * 110)
    window = analysis.since(now, start)
    assert (window.answered, window.failed) == (60, 10)
    # A replica that was not there at the start (or restarted: another identity): all of it is new.
    assert analysis.since(now, None) == now
    both = analysis.total([window, window])
    assert (both.answered, both.failed) == (120, 20)


def test_p99_is_interpolated_within_its_bucket_as_prometheus_does() -> None:
    buckets = {0.1: 50.0, 0.2: 100.0, float("inf"): 100.0}
    assert analysis.quantile(0.5, buckets) == pytest.approx(0.1)
    assert analysis.quantile(0.99, buckets) == pytest.approx(0.198)
    assert analysis.quantile(0.99, {0.1: 0.0, float("inf"): 0.0}) is None


def test_a_canary_is_not_judged_before_it_answered_the_minimum() -> None:
    verdict = analysis.judge(exposed(error=[0.02] * 49), exposed(success=[0.02] * 500), ANALYSIS)
    assert verdict.failure is None and not verdict.enough


def test_a_canary_failing_more_than_allowed_fails_with_the_figures() -> None:
    canary = exposed(success=[0.02] * 70, error=[0.02] * 30)
    verdict = analysis.judge(canary, exposed(success=[0.02] * 900), ANALYSIS)
    assert verdict.failure is not None
    assert "error rate 30.0% is 30.0% above the stable revision's, more than max_error_rate 5.0%" in (
        verdict.failure
    )
    assert "canary 30/100 failed" in verdict.failure


def test_inputs_that_fail_on_both_revisions_alike_are_not_the_canarys_fault() -> None:
    canary = exposed(success=[0.02] * 80, error=[0.02] * 20)
    stable = exposed(success=[0.02] * 820, error=[0.02] * 180)
    assert analysis.judge(canary, stable, ANALYSIS).failure is None
    worse = exposed(success=[0.02] * 70, error=[0.02] * 30)
    assert analysis.judge(worse, stable, ANALYSIS).failure is not None


def test_a_canary_three_times_slower_than_stable_fails_and_one_as_fast_passes() -> None:
    stable = exposed(success=[0.05] * 500)
    slow = analysis.judge(exposed(success=[0.15] * 100), stable, ANALYSIS)
    assert slow.failure is not None and "times the stable revision's" in slow.failure
    same = analysis.judge(exposed(success=[0.05] * 100), stable, ANALYSIS)
    assert same.failure is None and same.enough


def test_a_step_passes_only_once_its_latency_could_be_judged() -> None:
    # Too few stable answers for a p99: not failed, and not passed either (a slow revision must
    # not slip through a step before its latency is seen).
    verdict = analysis.judge(exposed(success=[0.5] * 100), exposed(success=[0.01] * 49), ANALYSIS)
    assert verdict.failure is None and not verdict.enough
    few = analysis.judge(exposed(success=[0.01] * 49), exposed(success=[0.01] * 500), ANALYSIS)
    assert few.failure is None and not few.enough  # above min_requests, below a p99's worth
    # A step of 100%: no stable answers at all, the canary's own are enough.
    alone = analysis.judge(exposed(success=[0.5] * 100), analysis.NO_ANSWERS, ANALYSIS)
    assert alone.failure is None and alone.enough


def test_a_steps_window_counts_each_revisions_replicas_from_the_steps_start() -> None:
    at_start = {"stable-a/0": exposed(success=[0.02] * 100), "canary-a/0": exposed(success=[0.02] * 5)}
    now = {
        "stable-a/0": exposed(success=[0.02] * 130),
        "canary-a/0": exposed(success=[0.02] * 5, error=[0.02] * 5),
        "canary-b/0": exposed(success=[0.02] * 4),  # came after the first look
        "older-canary/0": exposed(error=[0.02] * 50),  # a revision this rollout replaced: neither
    }
    canaries, stables = {"canary-a/0", "canary-b/0"}, {"stable-a/0"}
    # The first step: everything a canary replica answered is this revision's.
    first = analysis.step_starts(at_start, canaries, first_step=True)
    canary, stable = analysis.windows(now, first, canaries, stables)
    assert (canary.answered, canary.failed, stable.answered) == (14, 5, 30)
    later = analysis.step_starts(at_start, canaries, first_step=False)
    canary, _ = analysis.windows(now, later, canaries, stables)
    assert (canary.answered, canary.failed) == (9, 5)


def test_a_restarted_replica_counts_from_zero_by_its_identity_not_by_a_falling_count() -> None:
    at_start = {"canary-a/0": exposed(success=[0.02] * 100)}
    # The container restarted (its restart count is 1 now) and has answered 120 already: more than
    # at the step's start, so a falling count would not have told.
    now = {"canary-a/1": exposed(success=[0.02] * 120)}
    canary, _ = analysis.windows(
        now, analysis.step_starts(at_start, set(), first_step=False), {"canary-a/1"}, ()
    )
    assert canary.answered == 120
    # The same identity never counts backwards.
    fewer = {"canary-a/0": exposed(success=[0.02] * 90)}
    canary, _ = analysis.windows(fewer, at_start, {"canary-a/0"}, ())
    assert canary.answered == 0
