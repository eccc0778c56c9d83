"""The adaptive batching policy as pure functions: what it learns and what it decides."""

from __future__ import annotations

import pytest

from batchd.replica.adaptive import ArrivalRate, CostModel, plan


def learned(alpha: float, beta: float, sizes: list[int]) -> CostModel:
    cost = CostModel()
    for size in sizes:
        cost.observe(size, alpha + beta * size)
    return cost


def test_the_cost_line_is_learned_from_batches_of_several_sizes() -> None:
    cost = learned(0.020, 0.003, [1, 4, 8, 16, 32] * 4)
    alpha, beta = cost.fitted or (0, 0)
    assert alpha == pytest.approx(0.020) and beta == pytest.approx(0.003)
    assert cost.seconds(10) == pytest.approx(0.050)


def test_until_it_has_seen_two_sizes_it_knows_no_line() -> None:
    assert learned(0.02, 0.003, [8, 8, 8]).fitted is None


def test_it_follows_a_model_that_gets_slower() -> None:
    cost = learned(0.010, 0.001, [1, 8, 32] * 20)
    for _ in range(20):
        for size in (1, 8, 32):
            cost.observe(size, 0.030 + 0.003 * size)
    assert cost.seconds(32) == pytest.approx(0.126, rel=0.1)  # the new line, within a few dozen batches


def test_the_arrival_rate_is_items_over_the_last_second_or_so() -> None:
    rate = ArrivalRate()
    for tick in range(200):  # 100 items/s for two seconds
        rate.add(1, tick * 0.01)
    assert rate.at(2.0) == pytest.approx(100, rel=0.15)
    assert rate.at(5.0) < 10  # three seconds later it has mostly forgotten


def decide(
    queued: int,
    items_per_s: float,
    *,
    objective_s: float = 0.2,
    oldest_age_s: float = 0.0,
    running: int = 1,
) -> tuple[bool, int]:
    """The plan with `running` batches in the model (a second slot free)."""
    rate = ArrivalRate()
    for tick in range(int(items_per_s * 2)):
        rate.add(1, 8.0 + tick / items_per_s)
    result = plan(
        now=10.0,
        queued=queued,
        oldest_arrival=10.0 - oldest_age_s,
        objective_s=objective_s,
        max_batch_size=32,
        running=running,
        cost=learned(0.020, 0.003, [1, 8, 32] * 5),  # 23 ms for one item, 116 ms for 32
        rate=rate,
    )
    return result.go, result.size


def test_light_load_goes_at_once_with_what_is_there() -> None:
    assert decide(queued=1, items_per_s=5) == (True, 1)


def test_heavy_load_waits_for_a_batch_the_model_can_keep_up_with() -> None:
    go, size = decide(queued=2, items_per_s=200)  # 1 item keeps up with ~40/s: not with 200/s
    assert not go and 2 < size <= 32


def test_an_idle_model_takes_what_is_queued_at_once_whatever_the_load() -> None:
    # What arrives while this batch runs forms the next one: waiting would only add latency.
    assert decide(queued=2, items_per_s=200, running=0) == (True, 2)


def test_it_never_waits_past_the_oldest_items_objective() -> None:
    assert decide(queued=2, items_per_s=200, objective_s=0.2, oldest_age_s=0.15)[0] is True


def test_a_full_batch_or_an_overload_goes_at_once() -> None:
    assert decide(queued=32, items_per_s=200) == (True, 32)
    go, size = decide(queued=20, items_per_s=5000)  # nothing keeps up: largest batches, no waiting
    assert not go or size == 20


def test_a_burst_shows_in_the_queue_before_the_count_catches_up() -> None:
    # Nothing for seconds, then 20 items in the last 20 ms: the decayed count still says ~0/s,
    # but a batch of 20 beside a running one would not keep up with 1,000 items a second.
    result = plan(
        now=10.0,
        queued=20,
        oldest_arrival=9.98,
        objective_s=0.2,
        max_batch_size=32,
        running=1,
        cost=learned(0.020, 0.003, [1, 8, 32] * 5),
        rate=ArrivalRate(),  # nothing counted yet
    )
    assert not result.go and result.size == 32
