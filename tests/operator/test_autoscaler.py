"""The autoscaler's decisions, as pure functions of the load it is shown over time."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from batchd.api.manifest import parse_manifest
from batchd.operator.autoscaler import Autoscaler, Held, Policy, desired_replicas
from batchd.operator.replicas import ReplicaLoad, ReplicaPod
from batchd.testing.manifests import manifest

POLICY = Policy(
    min_replicas=1, max_replicas=4, target_ongoing_items=8, upscale_delay_s=10, downscale_delay_s=60
)


def run(
    autoscaler: Autoscaler, current: int, loads: Sequence[tuple[float, int]], policy: Policy = POLICY
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


def test_after_a_gap_in_observations_one_ask_does_not_decide_alone() -> None:
    # Two replicas' worth, then no observation for 30 s (a starved operator, a slow poll), then
    # four replicas' worth: the window that opens in the gap still holds the ask standing then.
    loads = [(t, 16) for t in range(0, 20, 5)] + [(50, 32), (55, 32), (60, 32)]
    counts = run(Autoscaler(), 2, loads)
    assert counts == [2, 2, 2, 2, 2, 2, 4]  # up once 10 s of asks agree, counted from the first of them
    # And down alike: one low ask after a gap takes nothing away.
    loads = [(t, 32) for t in range(0, 70, 5)] + [(200, 0), (230, 0), (265, 0)]
    counts = run(Autoscaler(), 4, loads)
    assert counts[-3:] == [4, 4, 1]


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
        ({"num_replicas": 1, "autoscaling": {"min_replicas": 0, "max_replicas": 5}}, 0, 0),  # kept at zero
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


TO_ZERO = Policy(
    min_replicas=0,
    max_replicas=4,
    target_ongoing_items=8,
    upscale_delay_s=10,
    downscale_delay_s=60,
    scale_to_zero_delay_s=120,
)


def observe(
    autoscaler: Autoscaler, current: int, seen: Sequence[tuple[float, int, int]], policy: Policy = TO_ZERO
) -> list[int]:
    """Feed (time, load, held requests) observations; the count after each, applying every decision."""
    counts = []
    for now, load, held in seen:
        current = autoscaler.decide(
            policy, current, load, current, now, Held(held, 1.0 if held else 0.0)
        ).replicas
        counts.append(current)
    return counts


def test_an_idle_deployment_goes_to_zero_only_after_the_whole_scale_to_zero_delay() -> None:
    counts = observe(Autoscaler(), 1, [(t, 0, 0) for t in range(0, 200, 5)])
    first_zero = counts.index(0)
    assert first_zero * 5 >= TO_ZERO.scale_to_zero_delay_s
    assert set(counts[first_zero:]) == {0}  # and stays there while nothing arrives


def test_any_load_or_held_request_within_the_delay_starts_the_idle_window_again() -> None:
    # One item every 100 s, one held request at 250 s: never 120 s idle in a row.
    seen = [(t, 1 if t % 100 == 0 else 0, 1 if t == 250 else 0) for t in range(0, 400, 5)]
    assert set(observe(Autoscaler(), 1, seen)) == {1}


def test_a_held_request_always_wakes_a_deployment_at_zero_at_once() -> None:
    autoscaler = Autoscaler()
    counts = observe(autoscaler, 0, [(0, 0, 0), (5, 0, 0), (10, 0, 1)])
    assert counts == [0, 0, 1]  # no upscale delay: a client is waiting
    decision = Autoscaler().decide(TO_ZERO, 0, 0, 0, 0.0, Held(3, 2.5))
    assert decision.reason == "3 request(s) held by the routers, the oldest waited 2.5 s"


def test_many_held_requests_wake_enough_replicas_for_them_within_max() -> None:
    assert Autoscaler().decide(TO_ZERO, 0, 0, 0, 0.0, Held(20, 1.0)).replicas == 3  # ceil(20 / 8)
    assert Autoscaler().decide(TO_ZERO, 0, 0, 0, 0.0, Held(1000, 1.0)).replicas == 4


def test_at_zero_nothing_but_a_held_request_starts_a_replica() -> None:
    assert set(observe(Autoscaler(), 0, [(t, 0, 0) for t in range(0, 400, 5)])) == {0}


def test_no_flapping_at_the_zero_boundary() -> None:
    # Woken by one request, served, idle again: back to zero only after another whole delay.
    autoscaler = Autoscaler()
    seen = [(0.0, 0, 1), (5.0, 1, 0)] + [(float(t), 0, 0) for t in range(10, 400, 5)]
    counts = observe(autoscaler, 0, seen)
    assert counts[0] == 1
    back_to_zero = counts.index(0, 1)
    assert seen[back_to_zero][0] - 5.0 >= TO_ZERO.scale_to_zero_delay_s
    assert counts.count(0) == len(counts) - back_to_zero  # one transition each way, no more


def test_replicas_that_do_not_answer_are_not_idle() -> None:
    autoscaler = Autoscaler()
    assert observe(autoscaler, 1, [(t, 0, 0) for t in range(0, 100, 5)]) == [1] * 20
    autoscaler.unobserved()  # the replica restarted and loads its model
    counts = observe(autoscaler, 1, [(t, 0, 0) for t in range(100, 300, 5)])
    assert counts.index(0) * 5 >= TO_ZERO.scale_to_zero_delay_s


@pytest.mark.parametrize("min_replicas", [1, 2])
def test_a_deployment_with_min_replicas_of_one_or_more_never_goes_to_zero(min_replicas: int) -> None:
    policy = Policy(min_replicas, 4, 8, 10, 60, scale_to_zero_delay_s=0)
    assert 0 not in observe(Autoscaler(), min_replicas, [(t, 0, 0) for t in range(0, 1000, 5)], policy)


def test_busy_replicas_scale_down_to_one_not_zero_through_the_downscale_window() -> None:
    seen = [(t, 30, 0) for t in range(0, 20, 5)] + [(t, 0, 0) for t in range(20, 100, 5)]
    counts = observe(Autoscaler(), 1, seen)
    assert counts[3] == 4
    assert 1 in counts and 0 not in counts  # 80 s idle: below the 120 s to go to zero


def test_held_requests_count_as_load_while_replicas_run() -> None:
    decision = Autoscaler().decide(TO_ZERO, 1, 8, 1, 0.0, Held(16, 1.0))
    assert decision.recommended == 3  # (8 + 16) / 8


def test_sheddable_items_add_no_replica_unless_counted_yet_keep_a_deployment_from_idling() -> None:
    # 64 items on one replica, 60 of them of a sheddable class: 4 counted, under one replica's 8.
    pod = ReplicaPod("r0", "198.18.0.9", 8000, True, False, None)
    replica = ReplicaLoad(pod, 64, 1, sheddable_items=60)
    assert (replica.counted(count_sheddable=False), replica.counted(count_sheddable=True)) == (4, 64)
    counts = []
    current, autoscaler = 1, Autoscaler()
    for now in range(0, 400, 5):
        load = replica.counted(TO_ZERO.count_sheddable)
        current = autoscaler.decide(TO_ZERO, current, load, 1, now, uncounted=replica.items - load).replicas
        counts.append(current)
    assert set(counts) == {1}  # neither up for the sheddable backlog nor down to zero beneath it
    counting = dataclasses.replace(TO_ZERO, count_sheddable=True)
    assert run(Autoscaler(), 1, [(t, 64) for t in range(0, 30, 5)], counting)[-1] == 4  # 64 / 8, at most 4
    spec = parse_manifest(manifest("m", autoscaling={"max_replicas": 2})).spec.autoscaling
    assert spec is not None and spec.count_sheddable is False
