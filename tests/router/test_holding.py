"""Held requests: released by a first replica, bounded in count and time, failed by a deletion."""

from __future__ import annotations

import asyncio

import pytest

from batchd.router.directory import DeploymentRef
from batchd.router.errors import HoldDisplaced, HoldRefused, UnknownModel
from batchd.router.holding import Holds
from batchd.router.metrics import RouterMetrics

REF = DeploymentRef("default", "adder")


def sample(metrics: RouterMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, {"namespace": "default", "deployment": "adder", **labels})
    return value or 0.0


async def held(holds: Holds, count: int) -> None:
    async with asyncio.timeout(5):
        while sum(int(entry["held_requests"]) for entry in holds.snapshot()) < count:  # type: ignore[call-overload]
            await asyncio.sleep(0)


async def test_a_first_replica_releases_every_held_request() -> None:
    metrics = RouterMetrics()
    holds = Holds(10, metrics)
    waiters = [asyncio.create_task(holds.wait(REF, "adder", 5)) for _ in range(3)]
    await held(holds, 3)
    assert holds.snapshot()[0]["model"] == "adder"
    assert sample(metrics, "batchd_router_held_requests") == 3
    holds.release(REF)
    await asyncio.gather(*waiters)
    assert holds.snapshot() == []
    assert sample(metrics, "batchd_router_held_requests") == 0
    assert sample(metrics, "batchd_router_cold_starts_total") == 3
    assert sample(metrics, "batchd_router_holds_total", outcome="released") == 3


async def test_past_the_count_a_request_is_refused_at_once() -> None:
    metrics = RouterMetrics()
    holds = Holds(2, metrics)
    waiters = [asyncio.create_task(holds.wait(REF, "adder", 5)) for _ in range(2)]
    await held(holds, 2)
    with pytest.raises(HoldRefused, match=r"'adder'.*2 requests already wait"):
        await holds.wait(REF, "adder", 5)
    holds.release(REF)
    await asyncio.gather(*waiters)
    assert sample(metrics, "batchd_router_holds_total", outcome="full") == 1


async def test_past_the_time_a_request_is_refused() -> None:
    metrics = RouterMetrics()
    holds = Holds(2, metrics)
    with pytest.raises(HoldRefused, match=r"within 0\.05 s"):
        await holds.wait(REF, "adder", 0.05)
    assert holds.snapshot() == []
    assert sample(metrics, "batchd_router_holds_total", outcome="timeout") == 1
    assert sample(metrics, "batchd_router_cold_starts_total") == 0


async def test_a_deleted_deployment_fails_its_held_requests_naming_the_model() -> None:
    metrics = RouterMetrics()
    holds = Holds(2, metrics)
    waiter = asyncio.create_task(holds.wait(REF, "adder", 5))
    await held(holds, 1)
    holds.fail(REF, "adder")
    with pytest.raises(UnknownModel, match=r"model 'adder': its BatchedDeployment default/adder was deleted"):
        await waiter
    assert sample(metrics, "batchd_router_holds_total", outcome="deleted") == 1


async def test_other_deployments_are_not_released() -> None:
    holds = Holds(2, RouterMetrics())
    waiter = asyncio.create_task(holds.wait(REF, "adder", 5))
    await held(holds, 1)
    holds.release(DeploymentRef("default", "other"))
    await asyncio.sleep(0)
    assert not waiter.done()
    holds.release(REF)
    await waiter


async def test_a_full_hold_makes_room_for_a_higher_class_and_releases_higher_classes_first() -> None:
    metrics = RouterMetrics()
    holds = Holds(3, metrics)
    order: list[str] = []

    async def one(name: str, priority: int) -> None:
        await holds.wait(REF, "adder", 5, priority)
        order.append(name)

    low_first = asyncio.create_task(one("low, first", 0))
    await held(holds, 1)
    low_last = asyncio.create_task(one("low, last", 0))
    middle = asyncio.create_task(one("middle", 5))
    await held(holds, 3)
    high = asyncio.create_task(one("high", 10))
    with pytest.raises(HoldDisplaced, match=r"'adder': a request of a higher priority class took its place"):
        await low_last  # the most recently held of the lowest class
    await held(holds, 3)
    with pytest.raises(HoldRefused, match=r"3 requests already wait"):
        await holds.wait(REF, "adder", 5, 0)  # no class below it to make room from
    holds.release(REF)
    await asyncio.gather(low_first, middle, high)
    assert order == ["high", "middle", "low, first"]
    assert sample(metrics, "batchd_router_holds_total", outcome="displaced") == 1
    assert sample(metrics, "batchd_router_holds_total", outcome="full") == 1


async def test_a_sheddable_class_is_held_only_under_half_the_bound() -> None:
    metrics = RouterMetrics()
    holds = Holds(4, metrics)
    waiters = [asyncio.create_task(holds.wait(REF, "adder", 5, -1)) for _ in range(2)]
    await held(holds, 2)
    with pytest.raises(HoldRefused, match=r"sheddable class is held only while fewer than 2 do"):
        await holds.wait(REF, "adder", 5, -1)
    waiters += [asyncio.create_task(holds.wait(REF, "adder", 5, 0)) for _ in range(2)]  # the default: held
    await held(holds, 4)
    holds.release(REF)
    await asyncio.gather(*waiters)
    assert sample(metrics, "batchd_router_holds_total", outcome="shed") == 1


async def test_a_replica_ready_before_the_wait_begins_is_not_waited_for() -> None:
    # The proxy looks for replicas, then its hold starts as a task: a release in between finds
    # nothing held, so the wait itself must look again.
    metrics = RouterMetrics()
    holds = Holds(2, metrics)
    waiter = asyncio.ensure_future(holds.wait(REF, "adder", 5, ready=lambda: True))
    holds.release(REF)  # the first replica comes before the wait's first step
    async with asyncio.timeout(1):
        await waiter
    assert holds.snapshot() == []
    assert sample(metrics, "batchd_router_holds_total", outcome="timeout") == 0
