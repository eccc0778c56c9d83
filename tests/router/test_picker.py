"""Power of two choices: the better of two random replicas, never an excluded one."""

from __future__ import annotations

import random
from collections import Counter

from batchd.router.picker import estimated_items, pick


def test_the_less_loaded_of_the_two_drawn_wins() -> None:
    loads = {"a": 5.0, "b": 0.0}
    rng = random.Random(1)
    assert {pick(["a", "b"], loads.__getitem__, rng) for _ in range(50)} == {"b"}


def test_the_most_loaded_replica_is_never_picked_among_three() -> None:
    loads = {"a": 0.0, "b": 1.0, "c": 9.0}
    rng = random.Random(2)
    picked = Counter(pick(list(loads), loads.__getitem__, rng) for _ in range(3000))
    assert picked["c"] == 0
    # a wins both draws it is in (2 of 3), b only the draw without a (1 of 3).
    assert 0.6 < picked["a"] / 3000 < 0.73


def test_equal_replicas_share_the_picks_evenly() -> None:
    rng = random.Random(3)
    picked = Counter(pick(["a", "b", "c", "d"], lambda _: 0.0, rng) for _ in range(4000))
    assert all(800 < count < 1200 for count in picked.values()), picked


def test_excluded_replicas_are_left_out_and_none_is_left_means_none() -> None:
    rng = random.Random(4)
    assert pick(["a", "b"], lambda _: 0.0, rng, exclude={"a"}) == "b"
    assert pick(["a"], lambda _: 0.0, rng, exclude={"a"}) is None
    assert pick([], lambda _: 0.0, rng) is None


def test_load_is_the_routers_own_plus_what_others_sent_at_the_last_read() -> None:
    assert estimated_items(own_now=3, polled_items=None, own_at_poll=0) == 3
    # The replica held 10 when the router had 4 there: 6 were others'; now the router has 2.
    assert estimated_items(own_now=2, polled_items=10, own_at_poll=4) == 8
    # A reading older than the router's own requests it counts never makes the load negative.
    assert estimated_items(own_now=0, polled_items=1, own_at_poll=5) == 0
