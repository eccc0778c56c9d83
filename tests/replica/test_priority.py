"""Priority classes and fair shares in the batcher (`batching.priority_classes`, `fair_share`): what
goes into the next batch, who makes room in a full queue, and what each refused request is told."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp
import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from batchd.api.spec import ANONYMOUS_TENANT, BatchingSpec
from batchd.replica.batching import Batcher
from batchd.replica.errors import (
    Displaced,
    InvalidInput,
    QueueFull,
    QueueTimedOut,
    Shed,
    TenantQueueFull,
    UnknownPriorityClass,
    answer_for,
    http_error,
)
from batchd.replica.front.protocols.openai.requests import who_asks
from batchd.replica.metrics import ClassFigures, ReplicaMetrics
from batchd.replica.queueing import fair_line
from batchd.replica.waiting import Client
from batchd.testing import manifests
from batchd.testing.servers import ServerProcess, replica_process, wait_until, write_manifest
from batchd.testing.traffic import Traffic
from tests.replica.test_batching import RecordingModel, make, occupied, until

UNKNOWN_URGENT = (
    "priority class (batchd-priority or metadata.priority): "
    "expected one of search, batch, prefetch, got 'urgent'"
)
CLASSES = [
    {"name": "search", "priority": 10},
    {"name": "batch", "priority": 0},
    {"name": "prefetch", "priority": -1},
]


def asking(priority: str | None = None, caller: str = "") -> Client:
    return Client(priority=priority, caller=caller)


def queued(
    batcher: Any, count: int, priority: str | None = None, caller: str = "", first: int = 0
) -> list[Any]:
    return [asyncio.ensure_future(batcher.infer([first + n], asking(priority, caller))) for n in range(count)]


async def test_a_batch_takes_every_higher_class_item_before_any_lower_one() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=4, batch_wait_timeout_s=0, priority_classes=CLASSES,
                   default_priority_class="batch")  # fmt: skip
    busy = await occupied(model, batcher)
    low = queued(batcher, 3, "prefetch", first=100)
    plain = queued(batcher, 3, first=200)  # the default class
    high = queued(batcher, 3, "search", first=300)
    await until(lambda: batcher.queue_depth == 9)
    model.gate.set()
    await asyncio.gather(busy, *low, *plain, *high)
    assert model.batches[1:] == [[300, 301, 302, 200], [201, 202, 100, 101], [102]]
    await batcher.drain()


async def test_callers_of_one_class_share_the_batches_equally_whatever_each_sends() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=4, batch_wait_timeout_s=0)
    busy = await occupied(model, batcher)
    heavy = queued(batcher, 40, caller="indexer", first=1000)
    light = queued(batcher, 4, caller="search-page", first=0)
    await until(lambda: batcher.queue_depth == 44)
    model.gate.set()
    await asyncio.gather(busy, *heavy, *light)
    # Both backlogged: turns, one item each, so the light caller is done in the first two batches.
    served = Counter("light" if item < 1000 else "heavy" for batch in model.batches[1:3] for item in batch)
    assert served == {"light": 4, "heavy": 4}
    await batcher.drain()


async def test_without_fair_share_one_class_is_first_come_first_served() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=4, batch_wait_timeout_s=0, fair_share=False)
    busy = await occupied(model, batcher)
    heavy = queued(batcher, 8, caller="indexer", first=1000)
    light = queued(batcher, 2, caller="search-page", first=0)
    await until(lambda: batcher.queue_depth == 10)
    model.gate.set()
    await asyncio.gather(busy, *heavy, *light)
    assert model.batches[1:] == [[1000, 1001, 1002, 1003], [1004, 1005, 1006, 1007], [0, 1]]
    await batcher.drain()


async def test_a_full_queue_makes_room_for_a_higher_class_the_displaced_request_told_to_retry() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=2, batch_wait_timeout_s=0, max_queued_requests=3,
                   priority_classes=CLASSES, default_priority_class="batch")  # fmt: skip
    busy = await occupied(model, batcher)
    older, newest = queued(batcher, 2, first=10), queued(batcher, 1, first=12)[0]
    await until(lambda: batcher.queue_depth == 3)
    with pytest.raises(QueueFull):  # its equal takes no one's place
        await batcher.infer([13], asking("batch"))
    urgent = asyncio.ensure_future(batcher.infer([1], asking("search")))
    with pytest.raises(Displaced) as displaced:
        await newest  # the most recently queued item of the lowest class
    answer = http_error(displaced.value)
    assert answer.status == 503 and dict(answer.headers)[b"retry-after"] >= b"1"
    assert answer.body["error"] == (
        "the queue was full and a request of priority class 'search' took the place of this one "
        "(class 'batch'); retry later"
    )
    assert answer_for(displaced.value).rejection == "displaced"
    model.gate.set()
    assert await urgent == [2]
    assert [await request for request in older] == [[11], [12]]
    await busy
    await batcher.drain()


async def test_sheddable_work_is_refused_at_half_the_queue_while_the_default_class_still_fits() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=2, batch_wait_timeout_s=0, max_queued_requests=8,
                   priority_classes=CLASSES, default_priority_class="batch")  # fmt: skip
    busy = await occupied(model, batcher)
    kept = queued(batcher, 3, "prefetch") + queued(batcher, 1)
    await until(lambda: batcher.queue_depth == 4)
    with pytest.raises(Shed) as shed:
        await batcher.infer([1], asking("prefetch"))
    assert "'prefetch' is sheddable: refused while 4 or more items are queued" in str(shed.value)
    assert answer_for(shed.value).rejection == "shed" and answer_for(shed.value).refused
    more = queued(batcher, 4)  # the default class fills the rest of the queue
    model.gate.set()
    await asyncio.gather(busy, *kept, *more)
    await batcher.drain()


async def test_an_idle_replica_admits_a_sheddable_request_larger_than_half_the_queue() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=2, batch_wait_timeout_s=0, max_queued_requests=8,
                   priority_classes=CLASSES, default_priority_class="batch")  # fmt: skip
    busy = await occupied(model, batcher)
    large = asyncio.ensure_future(batcher.infer(list(range(6)), asking("prefetch")))  # 6 of 8 places
    await until(lambda: batcher.queue_depth == 6)
    model.gate.set()
    assert await large == [1, 2, 3, 4, 5, 6]
    await busy
    await batcher.drain()


async def test_a_class_still_queued_after_its_queue_timeout_is_refused_with_503_and_the_others_wait_on() -> (
    None
):
    model = RecordingModel()
    metrics = ReplicaMetrics("d", "m")
    timed = [{"name": "search", "priority": 10, "queue_timeout_s": 0.2}, {"name": "batch", "priority": 0}]
    batcher = Batcher(
        BatchingSpec.model_validate(
            {
                "max_batch_size": 1,
                "batch_wait_timeout_s": 0,
                "priority_classes": timed,
                "default_priority_class": "batch",
            }
        ),
        observer=metrics,
    )
    batcher.start(model)
    busy = await occupied(model, batcher)
    patient = asyncio.ensure_future(batcher.infer([1], asking("batch")))
    with pytest.raises(QueueTimedOut) as late:
        await batcher.infer([2], asking("search"))
    answer = http_error(late.value)
    assert answer.status == 503 and int(dict(answer.headers)[b"retry-after"]) >= 1
    assert b"batchd-refused" not in dict(answer.headers)  # it had been accepted: not sent elsewhere
    assert (
        answer.body["error"]
        == "priority class 'search': still queued after its queue_timeout_s of 0.2 s; retry later"
    )
    assert answer_for(late.value).rejection == "queue_timeout"
    assert batcher.queue_depth == 1 and not patient.done()  # the batch class has no such limit
    model.gate.set()
    assert await patient == [2]
    await busy
    text = generate_latest(metrics.registry).decode()
    assert 'priority_class="search",reason="queue_timeout"} 1.0' in text
    await batcher.drain()


async def test_requests_that_stopped_waiting_leave_the_depth_and_the_sheddable_count_at_once() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=2, batch_wait_timeout_s=0, priority_classes=CLASSES,
                   default_priority_class="batch")  # fmt: skip
    busy = await occupied(model, batcher)
    leaving = queued(batcher, 3, "prefetch") + queued(batcher, 2)
    staying = queued(batcher, 1, "prefetch")
    await until(lambda: batcher.queue_depth == 6)
    assert batcher.sheddable_items == 4 and dict(batcher.class_depths())["prefetch"] == 4
    for request in leaving:
        request.cancel()  # their clients went away
    await until(lambda: batcher.queue_depth == 1)
    assert batcher.sheddable_items == 1 and dict(batcher.class_depths()) == {
        "search": 0,
        "batch": 0,
        "prefetch": 1,
    }
    model.gate.set()
    await asyncio.gather(busy, *staying)
    assert [item for batch in model.batches for item in batch] == [0, 0]  # the others never ran
    await asyncio.gather(*leaving, return_exceptions=True)
    await batcher.drain()


async def test_the_sheddable_items_queued_or_running_are_counted_apart_for_autoscaling() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=2, batch_wait_timeout_s=0, priority_classes=CLASSES,
                   default_priority_class="prefetch")  # fmt: skip
    busy = await occupied(model, batcher)  # the default class here is the sheddable one
    waiting = queued(batcher, 3, "prefetch") + queued(batcher, 2, "search")
    await until(lambda: batcher.queue_depth == 5)
    assert batcher.sheddable_items == 1 + 3  # the running item and the three queued
    model.gate.set()
    await asyncio.gather(busy, *waiting)
    assert batcher.sheddable_items == 0
    await batcher.drain()


async def test_an_unknown_class_is_a_400_naming_it_and_the_known_ones() -> None:
    batcher = make(RecordingModel(), priority_classes=CLASSES, default_priority_class="batch")
    with pytest.raises(UnknownPriorityClass) as unknown:
        await batcher.infer([1], asking("urgent"))
    assert http_error(unknown.value).status == 400
    assert str(unknown.value) == UNKNOWN_URGENT
    await batcher.drain()


async def test_retuned_classes_keep_what_is_queued_and_order_it_by_the_new_priorities() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=8, batch_wait_timeout_s=0, priority_classes=CLASSES,
                   default_priority_class="batch")  # fmt: skip
    busy = await occupied(model, batcher)
    low, high = queued(batcher, 2, "prefetch", first=100), queued(batcher, 2, "search", first=300)
    await until(lambda: batcher.queue_depth == 4)
    flipped = [{"name": "search", "priority": -1}, {"name": "prefetch", "priority": 10}]
    retuned = {"max_batch_size": 8, "batch_wait_timeout_s": 0, "priority_classes": flipped}
    batcher.reconfigure(BatchingSpec.model_validate({**retuned, "default_priority_class": "prefetch"}))
    model.gate.set()
    await asyncio.gather(busy, *low, *high)
    assert model.batches[1] == [100, 101, 300, 301]
    await batcher.drain()


# -- on a real `batchd serve` process: the headers through both fronts ------------------------------

BATCH_S = 1.0  # one item in the model and one in the queue: two requests fill the replica
PREDICT = "/v1/models/ranked:predict"  # answered on the direct path
INFER = "/v2/models/ranked/infer"  # answered by the ASGI front


@pytest.fixture(scope="module")
def ranked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("ranked")
    document = manifests.tight(BATCH_S, "ranked")
    document["spec"]["batching"] |= {"priority_classes": CLASSES, "default_priority_class": "batch"}
    with replica_process(write_manifest(directory, document), directory) as server:
        yield server


def v2(item: int) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [item]}]}


@pytest.mark.slow
@pytest.mark.parametrize(("path", "body"), [(PREDICT, {"instances": [5]}), (INFER, v2(5))])
async def test_a_request_naming_a_higher_class_takes_a_queued_ones_place(
    ranked: ServerProcess, path: str, body: dict[str, Any]
) -> None:
    await asyncio.to_thread(wait_until, lambda: ranked.idle(), 10, "ranked idle")
    async with httpx.AsyncClient(base_url=ranked.url, timeout=30) as client:
        running = asyncio.ensure_future(client.post(PREDICT, json={"instances": [1]}))
        await asyncio.to_thread(wait_until, lambda: ranked.load()["running_items"] == 1, 5, "ranked busy")
        waiting = asyncio.ensure_future(client.post(PREDICT, json={"instances": [2]}))
        await asyncio.to_thread(wait_until, lambda: ranked.load()["queued_items"] == 1, 5, "ranked full")
        urgent = await client.post(
            path, json=body, headers={"batchd-priority": "search", "batchd-fairness-id": "page"}
        )
        displaced, ran = await asyncio.gather(waiting, running)
    assert urgent.status_code == 200, urgent.text
    assert ran.status_code == 200
    assert displaced.status_code == 503 and int(displaced.headers["retry-after"]) >= 1
    assert "a request of priority class 'search' took the place of this one" in displaced.json()["error"]
    assert "batchd-refused" not in displaced.headers  # it had been accepted: a router does not resend it


@pytest.mark.slow
@pytest.mark.parametrize(("path", "body"), [(PREDICT, {"instances": [5]}), (INFER, v2(5))])
def test_an_unknown_class_is_refused_naming_it_on_both_fronts(
    ranked: ServerProcess, path: str, body: dict[str, Any]
) -> None:
    refused = httpx.post(f"{ranked.url}{path}", json=body, headers={"batchd-priority": "urgent"}, timeout=30)
    assert refused.status_code == 400
    assert UNKNOWN_URGENT in refused.text


def test_the_openai_routes_take_the_class_from_metadata_and_the_caller_from_user_unless_headers_say() -> None:
    body = {"model": "m", "input": "x", "metadata": {"priority": "search", "trace": "t1"}, "user": "tenant-a"}
    assert who_asks(body) == ("search", "tenant-a")
    assert who_asks({"model": "m", "input": "x"}) == (None, None)
    assert Client().asking(*who_asks(body)) == Client(priority="search", caller="tenant-a")
    headers = Client(priority="batch", caller="tenant-b")
    assert headers.asking(*who_asks(body)) == headers  # the headers win
    with pytest.raises(InvalidInput, match=r"^metadata: expected an object of at most 16 string values"):
        who_asks({"metadata": {"priority": 3}})
    with pytest.raises(InvalidInput, match=r"^user: expected a string, got 7"):
        who_asks({"user": 7})


def test_class_figures_count_by_class_and_items_by_tenant_never_by_an_id_a_client_chose() -> None:
    registry = CollectorRegistry()
    figures = ClassFigures(registry, ("deployment", "model"), ("d", "m"))
    figures.track(lambda: [("search", 0), ("batch", 3)])
    figures.refused("batch", "displaced", 1)
    figures.refused("prefetch", "shed", 4)
    for n in range(21):  # fairness ids of two tenants' callers, and of an open deployment's
        figures.served("batch", fair_line(("acme", "globex", ANONYMOUS_TENANT)[n % 3], f"caller-{n}"), 0.002)
    figures.served("search", "", 0.5)
    families = {
        family.name: family for family in text_string_to_metric_families(generate_latest(registry).decode())
    }

    def value(family: str, sample: str, **labels: str) -> float:
        (found,) = [
            s.value
            for s in families[family].samples
            if s.name == sample and labels.items() <= s.labels.items()
        ]
        return found

    assert value("batchd_class_queue_depth", "batchd_class_queue_depth", priority_class="batch") == 3
    assert (
        value(
            "batchd_class_refusals", "batchd_class_refusals_total", priority_class="prefetch", reason="shed"
        )
        == 4
    )
    assert (
        value(
            "batchd_class_queue_wait_seconds", "batchd_class_queue_wait_seconds_count", priority_class="batch"
        )
        == 21
    )
    served = {s.labels["tenant"]: s.value for s in families["batchd_tenant_items"].samples}
    assert served == {"acme": 7, "globex": 7, ANONYMOUS_TENANT: 8}


async def test_first_come_order_serves_every_class_in_arrival_order_and_takes_no_ones_place() -> None:
    model = RecordingModel()
    ranked = {"priority_classes": CLASSES, "default_priority_class": "batch", "queue_order": "first_come"}
    batcher = make(model, max_batch_size=4, batch_wait_timeout_s=0, max_queued_requests=6, **ranked)
    busy = await occupied(model, batcher)
    low = queued(batcher, 3, "prefetch", first=100)
    plain = queued(batcher, 2, first=200)
    high = queued(batcher, 1, "search", first=300)
    await until(lambda: batcher.queue_depth == 6)
    with pytest.raises(QueueFull):  # full: a higher class waits its turn like everyone else
        await batcher.infer([301], asking("search"))
    assert batcher.class_depths() == [("search", 1), ("batch", 2), ("prefetch", 3)]  # counted by class
    model.gate.set()
    await asyncio.gather(busy, *low, *plain, *high)
    assert model.batches[1:] == [[100, 101, 102, 200], [201, 300]]
    await batcher.drain()


# -- under overload, on real replicas: equal classes, and clients that give up -----------------------

# A replica of 160 items/s whatever the CPU does: one batch of 8 every 50 ms.
SLOW_ADDER = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": 0.05}}
CAPACITY_RPS = 160
LOAD_S = 3.0


@contextmanager
def overloaded(factory: pytest.TempPathFactory, name: str, **batching: Any) -> Iterator[ServerProcess]:
    """A replica of `SLOW_ADDER` named `name`, with these batching settings besides its own."""
    directory = factory.mktemp(name)
    limits = {"max_batch_size": 8, "batch_wait_timeout_s": 0.005, **batching}
    document = manifests.manifest(name, SLOW_ADDER, batching=limits)
    with replica_process(write_manifest(directory, document), directory) as server:
        yield server


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Two classes of one priority, and a short queue."""
    equals = [{"name": "gold", "priority": 5}, {"name": "silver", "priority": 5}]
    with overloaded(tmp_path_factory, "peers", max_queued_requests=32, priority_classes=equals,
                    default_priority_class="gold") as server:  # fmt: skip
        yield server


def refusals(server: ServerProcess, reason: str) -> dict[str, float]:
    """The replica's batchd_class_refusals_total for `reason`, by class."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(server.metrics()):
        for sample in family.samples:
            if sample.name == "batchd_class_refusals_total" and sample.labels["reason"] == reason:
                found[sample.labels["priority_class"]] = sample.value
    return found


@pytest.mark.slow
async def test_classes_of_equal_priority_are_served_alike_and_take_no_place_from_each_other(
    peers: ServerProcess,
) -> None:
    url = f"{peers.url}/v1/models/peers:predict"
    answers: Counter[str] = Counter()

    async def one(session: aiohttp.ClientSession, priority_class: str) -> None:
        async with session.post(
            url, data=b'{"instances": [1]}', headers={"batchd-priority": priority_class}
        ) as answer:
            body = await answer.read()
            answers[f"{priority_class} {answer.status} {body[:60].decode()}"] += 1

    # Three times the capacity, an open loop whose requests alternate between the classes: the queue
    # is full all along, and neither class's requests come sooner than the other's.
    rate = 3 * CAPACITY_RPS
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        started, sent = time.monotonic(), []
        for n in range(int(rate * LOAD_S)):
            await asyncio.sleep(max(0.0, started + n / rate - time.monotonic()))
            sent.append(asyncio.ensure_future(one(session, ("gold", "silver")[n % 2])))
        await asyncio.gather(*sent)
    served = {name: answers[f'{name} 200 {{"predictions":[2]}}'] for name in ("gold", "silver")}
    assert min(served.values()) * 1.2 >= max(served.values()), answers
    assert refusals(peers, "displaced") == {"gold": 0, "silver": 0}
    assert all(" 200 " in answer or "queue full" in answer for answer in answers), answers  # no place taken


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    ranks = [{"name": "high", "priority": 10}, {"name": "low", "priority": 0}]
    with overloaded(tmp_path_factory, "mixed", max_queued_requests=80, priority_classes=ranks,
                    default_priority_class="low") as server:  # fmt: skip
        yield server


@pytest.mark.slow
async def test_requests_whose_clients_gave_up_hold_no_place_so_no_live_request_is_refused(
    mixed: ServerProcess,
) -> None:
    path, body = "/v1/models/mixed:predict", b'{"instances": [1]}'
    url = f"{mixed.url}{path}"
    high: Counter[int] = Counter()

    async def high_client(session: aiohttp.ClientSession, until: float) -> None:
        while time.monotonic() < until:
            async with session.post(url, data=body, headers={"batchd-priority": "high"}) as answer:
                await answer.read()
                high[answer.status] += 1

    # The high class keeps every batch full (32 closed-loop clients: four batches' worth, twice
    # what the replica serves at once), so the low class is never served: its clients give up
    # after 200 ms. About 40 x 0.2 = 8 of them wait alive at a time, and 32 of the high class:
    # within the queue's 80, with room for the dead of a second more (a busy machine sees a
    # client go late), while the 120 dead would fill it in 1.2 s if they counted.
    low = Traffic(lambda: [mixed.url], path, body, 0.25 * CAPACITY_RPS, timeout_s=0.2)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        until = time.monotonic() + LOAD_S
        await asyncio.gather(low.run(LOAD_S), *(high_client(session, until) for _ in range(32)))
    gave_up = sum(outcome.status is None for outcome in low.outcomes)
    assert gave_up > 80, "too few clients of the low class gave up to fill the queue with the dead"
    assert set(high) == {200}, high
    answered = Counter(outcome.status for outcome in low.outcomes if outcome.status is not None)
    assert set(answered) <= {200}, (answered, {o.error for o in low.outcomes if o.status not in (None, 200)})
    text = mixed.metrics()
    assert 'batchd_rejections_total{deployment="mixed",model="mixed",reason="queue_full"} 0.0' in text
    assert refusals(mixed, "displaced") == {"high": 0, "low": 0}  # no live one had to make room either


def tenant(name: str, share: int, priority: str | None = None, caller: str = "") -> Client:
    """A caller of tenant `name` as the gate makes it: its fair line within the tenant, and its share."""
    return Client(priority=priority, caller=caller, tenant=name, queue_items=share)


async def test_one_tenant_cannot_fill_the_queue_while_the_others_wait() -> None:
    model = RecordingModel()
    batcher = make(model, max_batch_size=2, batch_wait_timeout_s=0, max_queued_requests=8,
                   priority_classes=CLASSES, default_priority_class="batch")  # fmt: skip
    busy = await occupied(model, batcher)
    # acme may have half the queue waiting: four items, in any class, from any of its callers.
    acme = [asyncio.ensure_future(batcher.infer([n], tenant("acme", 4, caller=f"c{n}"))) for n in range(4)]
    await until(lambda: batcher.queue_depth == 4)
    with pytest.raises(TenantQueueFull, match=r"tenant 'acme' has its share .* \(4 items\)") as refused:
        await batcher.infer([9], tenant("acme", 4, "search"))
    assert refused.value.retry_after_s > 0
    # Its claim to the top class displaces nothing: the queue had room, only not for acme.
    assert batcher.queue_depth == 4 and not any(future.done() for future in acme)
    globex = [asyncio.ensure_future(batcher.infer([100 + n], tenant("globex", 4))) for n in range(4)]
    await until(lambda: batcher.queue_depth == 8)
    acme[0].cancel()  # one of acme's requests leaves: its place is acme's again
    await until(lambda: batcher.queue_depth == 7)
    again = asyncio.ensure_future(batcher.infer([5], tenant("acme", 4)))
    await until(lambda: batcher.queue_depth == 8)
    model.gate.set()
    await asyncio.gather(busy, *acme[1:], *globex, again)
    await batcher.drain()
