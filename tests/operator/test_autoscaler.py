"""The autoscaler's decisions, as pure functions of the load it is shown over time."""

from __future__ import annotations

from typing import Any

import pytest

from batchd.api.manifest import parse_manifest
from batchd.operator.autoscaler import Autoscaler, Policy, desired_replicas
from batchd.testing.manifests import manifest

POLICY = Policy(
    min_replicas=1, max_replicas=4, target_ongoing_items=8, upscale_delay_s=10, downscale_delay_s=60
)


def run(
    autoscaler: Autoscaler, current: int, loads: list[tuple[float, int]], policy: Policy = POLICY
) -> list[int]:
    """Feed (time, load) observations; the count after each, applying every decision."""
    counts = []
    for now, load in loads:
        current = autoscaler.decide(policy, current, load, current, now).replicas
        counts.append(current)
    return counts


def test_the_load_asks_for_load_over_target_replicas_within_the_bounds() -> None:
    autoscaler = Autoscaler()
    for load, wanted in [(0, 1), (8, 1), (9, 2), (24, 3), (1000, 4)]:
        assert autoscaler.decide(POLICY, 1, load, 1, 0.0).recommended == wanted


def test_a_burst_shorter_than_the_upscale_delay_adds_nothing() -> None:
    counts = run(Autoscaler(), 1, [(t, 40 if 10 <= t < 15 else 4) for t in range(0, 40, 5)])
    assert set(counts) == {1}


def test_sustained_load_scales_up_after_the_upscale_delay_and_at_once_to_what_it_needs() -> None:
    counts = run(Autoscaler(), 1, [(t, 30) for t in range(0, 25, 5)])
    assert counts == [1, 1, 4, 4, 4]  # ceil(30 / 8) = 4, first decided once 10 s of asks agree


def test_scale_down_waits_for_the_downscale_delay_then_goes_to_the_highest_recent_ask() -> None:
    autoscaler = Autoscaler()
    loads = [(t, 30) for t in range(0, 20, 5)] + [(t, 2) for t in range(20, 120, 5)]
    counts = run(autoscaler, 1, loads)
    assert counts[3] == 4
    first_down = next(i for i, count in enumerate(counts) if i > 3 and count < 4)
    assert loads[first_down][0] - 20 >= POLICY.downscale_delay_s  # low for a whole window first
    assert counts[-1] == 1


def test_steady_load_that_wobbles_twenty_percent_never_flaps() -> None:
    # 20 items = 2.5 replicas' worth; +-20% asks for 2 or 3 replicas, poll by poll.
    wobble = [16, 24, 20, 18, 23, 17, 22, 24, 16, 20]
    counts = run(Autoscaler(), 3, [(t * 5.0, wobble[t % len(wobble)]) for t in range(200)])
    assert set(counts) == {3}


def test_a_restarted_operator_scales_nothing_before_it_has_watched_a_whole_window() -> None:
    autoscaler = Autoscaler()
    assert [d.replicas for d in (autoscaler.decide(POLICY, 4, 0, 4, t) for t in (100.0, 105.0, 110.0))] == [
        4
    ] * 3


def test_new_bounds_apply_at_once() -> None:
    tighter = Policy(2, 3, 8, 10, 60)
    decision = Autoscaler().decide(tighter, 1, 0, 1, 0.0)
    assert (decision.replicas, decision.reason) == (2, "min_replicas is 2")
    assert Autoscaler().decide(tighter, 5, 100, 5, 0.0).replicas == 3


@pytest.mark.parametrize(
    ("spec", "last", "expected"),
    [
        ({"num_replicas": 3}, None, 3),
        ({"num_replicas": 3}, 7, 3),  # without autoscaling the spec decides
        ({"num_replicas": 3, "autoscaling": {"max_replicas": 5}}, None, 3),
        ({"num_replicas": 9, "autoscaling": {"max_replicas": 5}}, None, 5),
        ({"num_replicas": 1, "autoscaling": {"max_replicas": 5}}, 4, 4),
        ({"num_replicas": 1, "autoscaling": {"min_replicas": 2, "max_replicas": 5}}, 1, 2),
    ],
)
def test_desired_replicas_from_the_spec_and_the_last_decision(
    spec: dict[str, Any], last: int | None, expected: int
) -> None:
    assert desired_replicas(parse_manifest(manifest("m", **spec)), last) == expected


def test_the_default_target_is_one_full_batch_per_slot() -> None:
    bd = parse_manifest(
        manifest(
            "m",
            autoscaling={"max_replicas": 3},
            batching={"max_batch_size": 16, "max_concurrent_batches": 2},
        )
    )
    policy = Policy.of(bd)
    assert policy is not None and policy.target_ongoing_items == 32
    assert Policy.of(parse_manifest(manifest("m"))) is None
