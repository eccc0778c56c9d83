"""Model composition with real replicas: a composer's handler calls other deployments through handles.

Three `batchd serve` processes on loopback, wired the way `batchd serve --call` wires them locally:
- `callee` doubles numbers (and fails on negative ones), batching up to 16 items for 50 ms;
- `tight` adds one after holding each batch of one for 3 s, with room for one waiting item: easy
  to overload and slower than the composer's deadline;
- `composer` relays each item to the callee it names (`batchd.testing.batch_handlers:Relay`), one item
  a batch (`max_batch_size: 1`) and up to 64 batches at once: whatever batching happens below it
  is the callee's, across the composer's requests; its own deadline is 1.5 s;
- and `nowhere`, an alias of the composer's whose address has nothing listening.
Then the example of examples/classifier.py: a sentiment classifier over MiniLM's embeddings.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchd.api.environment import SettingsError
from batchd.api.spec import ModelSpec
from batchd.replica import cli
from batchd.replica.loading import load_model
from batchd.replica.models import ModelLoadError
from batchd.replica.settings import ReplicaSettings
from batchd.testing import ROOT, manifests
from batchd.testing.manifests import manifest
from batchd.testing.models import minilm_mirror
from batchd.testing.promtext import Histogram, parse_histogram
from batchd.testing.servers import (
    ServerProcess,
    batchd_command,
    free_port,
    running,
    start_process,
    start_replica,
    wait_until,
    write_manifest,
)

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "examples"
COMPOSER_TIMEOUT_S = 1.5
TIGHT_BATCH_S = 3.0


@dataclass
class Stack:
    callee: ServerProcess
    tight: ServerProcess
    composer: ServerProcess
    nowhere: str

    @property
    def predict(self) -> str:
        return f"{self.composer.url}/v1/models/composer:predict"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("composition")
    callee = manifests.doubler("callee", batch_wait_timeout_s=0.05)
    tight = manifests.tight(TIGHT_BATCH_S)
    composer = manifest(
        "composer",
        {
            "handler": "batchd.testing.batch_handlers:Relay",
            "calls": {"callee": "callee", "tight": "tight", "nowhere": "ghost"},
        },
        batching={"max_batch_size": 1, "max_concurrent_batches": 64, "request_timeout_s": COMPOSER_TIMEOUT_S},
    )
    callees = [start_replica(write_manifest(directory, doc), directory / "logs") for doc in (callee, tight)]
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    calls = [f"--call=callee={callees[0].url}", f"--call=tight={callees[1].url}", f"--call=nowhere={nowhere}"]
    composer_process = start_process(
        "composer",
        [*batchd_command(), "serve", str(write_manifest(directory, composer)), *calls],
        directory / "logs",
    )
    with running([*callees, composer_process]):
        yield Stack(callees[0], callees[1], composer_process, nowhere)


def batch_sizes(server: ServerProcess) -> Histogram:
    return parse_histogram(server.metrics(), "batchd_batch_size")


async def call(client: httpx.AsyncClient, stack: Stack, **item: Any) -> httpx.Response:
    return await client.post(stack.predict, json={"instances": [item]}, timeout=30)


async def test_calls_from_many_composer_requests_are_batched_together_by_the_callee(stack: Stack) -> None:
    callee_before, composer_before = batch_sizes(stack.callee), batch_sizes(stack.composer)
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(limits=limits) as client:
        answers = await asyncio.gather(*(call(client, stack, to="callee", n=n) for n in range(64)))
    assert [answer.status_code for answer in answers] == [200] * 64
    assert [answer.json()["predictions"] for answer in answers] == [[2 * n] for n in range(64)]

    composer = batch_sizes(stack.composer).minus(composer_before)
    assert (composer.count, composer.sum) == (64, 64)  # the composer batched nothing: one item a batch
    callee = batch_sizes(stack.callee).minus(callee_before)
    assert callee.sum == 64
    # ... and the callee gathered the calls of many composer requests into each of its batches.
    assert callee.mean > 4, callee.distribution()


async def test_remote_many_sends_a_list_in_one_call(stack: Stack) -> None:
    async with httpx.AsyncClient() as client:
        answer = await call(client, stack, to="callee", many=[1, 2, 3])
    assert answer.status_code == 200, answer.text
    assert answer.json()["predictions"] == [[2, 4, 6]]


async def test_a_failing_callee_gives_the_caller_an_error_naming_it(stack: Stack) -> None:
    async with httpx.AsyncClient() as client:
        bad, good = await asyncio.gather(
            call(client, stack, to="callee", n=-1), call(client, stack, to="callee", n=5)
        )
    assert bad.status_code == 500
    error = bad.json()["error"]
    assert "callee 'callee' (BatchedDeployment 'callee') answered 422" in error, error
    assert "negative input" in error  # the callee's own reason
    assert good.status_code == 200 and good.json()["predictions"] == [10]  # others are unaffected


async def test_an_overloaded_callee_gives_the_caller_503_with_retry_after_naming_it(stack: Stack) -> None:
    wait_until(lambda: stack.tight.idle(), 10, "tight idle")
    async with httpx.AsyncClient() as client:
        # One call holds the callee's model, a second fills its one place in the queue ...
        busy = asyncio.ensure_future(call(client, stack, to="tight", n=1))
        await asyncio.to_thread(wait_until, lambda: stack.tight.load()["running_items"] == 1, 5, "tight busy")
        queued = asyncio.ensure_future(call(client, stack, to="tight", n=2))
        await asyncio.to_thread(wait_until, lambda: stack.tight.load()["queued_items"] == 1, 5, "tight full")
        # ... so the third is refused by the callee, and the composer's caller is told so.
        started = time.monotonic()
        refused = await call(client, stack, to="tight", n=3)
        elapsed = time.monotonic() - started
        await asyncio.gather(busy, queued)
    assert refused.status_code == 503, refused.text
    assert int(refused.headers["retry-after"]) >= 1
    # The composer had accepted the request: a router must not send it to another replica.
    assert "batchd-refused" not in refused.headers
    error = refused.json()["error"]
    assert "callee 'tight' (BatchedDeployment 'tight') answered 503: queue full" in error, error
    assert elapsed < 1.0  # refused at once, not after waiting


async def test_the_composers_deadline_bounds_the_whole_call(stack: Stack) -> None:
    wait_until(lambda: stack.tight.idle(), 10, "tight idle")
    async with httpx.AsyncClient() as client:
        started = time.monotonic()
        answer = await call(client, stack, to="tight", n=1)  # the callee takes 3 s
        elapsed = time.monotonic() - started
        assert answer.status_code == 504, answer.text
        assert COMPOSER_TIMEOUT_S - 0.1 <= elapsed < COMPOSER_TIMEOUT_S + 1.0
        # The composer's batch let go of the call at its deadline: the composer is empty again
        # while the callee is still computing its 3 s batch.
        await asyncio.to_thread(wait_until, lambda: stack.composer.idle(), 1.0, "composer idle")
        assert stack.tight.load()["running_items"] == 1
        assert time.monotonic() - started < TIGHT_BATCH_S
        # ... and it answers its next request as usual.
        assert (await call(client, stack, to="callee", n=4)).json()["predictions"] == [8]


async def test_an_unreachable_callee_gives_the_caller_503_naming_it(stack: Stack) -> None:
    async with httpx.AsyncClient() as client:
        started = time.monotonic()
        answer = await call(client, stack, to="nowhere", n=1)
    assert time.monotonic() - started < 1.0
    assert answer.status_code == 503 and "retry-after" in answer.headers
    assert "batchd-refused" not in answer.headers  # accepted before the callee failed
    error = answer.json()["error"]
    assert f"callee 'nowhere' (BatchedDeployment 'ghost') unreachable at {stack.nowhere}" in error, error


def test_a_composer_without_an_address_for_an_alias_says_how_to_give_one(tmp_path: Path) -> None:
    composer = manifest(
        "composer", {"handler": "batchd.testing.batch_handlers:Relay", "calls": {"embedder": "minilm"}}
    )
    process = start_replica(write_manifest(tmp_path, composer), tmp_path / "logs")
    try:
        assert process.process.wait(timeout=60) == 3
    finally:
        process.stop()
    assert "model.calls.embedder: no address for BatchedDeployment 'minilm'" in process.log()
    assert "--call embedder=http://HOST:PORT" in process.log()


def test_a_sync_handler_cannot_take_handles() -> None:
    spec = ModelSpec(handler="batchd.testing.batch_handlers:SyncRelay", calls={"other": "adder"})
    with pytest.raises(ModelLoadError, match="is not `async def`; a handler awaits its handles"):
        load_model(spec, mirror_dir=None, pvc_root=Path("/models"), calls={"other": "http://127.0.0.1:1"})


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("embedder", "--call 'embedder': expected ALIAS=URL"),
        ("embedder=localhost:8001", "--call embedder: expected a base URL such as http://127.0.0.1:8001"),
        ("embedder=http://h:1/v1/models/x", "expected a base URL"),
    ],
)
def test_a_malformed_call_flag_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, says: str
) -> None:
    path = write_manifest(tmp_path, manifest("composer", {"handler": "m:C", "calls": {"embedder": "minilm"}}))
    assert cli.main(["serve", str(path), "--call", flag]) == 2
    assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("notjson", 'BATCHD_CALLS: expected JSON such as {"embedder": "http://127.0.0.1:8001"}'),
        ('{"embedder": "ftp://x"}', "BATCHD_CALLS: embedder: expected a base URL"),
    ],
)
def test_a_bad_calls_variable_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, value: str, says: str
) -> None:
    monkeypatch.setenv("BATCHD_CALLS", value)
    with pytest.raises(SettingsError, match=re.escape(says)):
        ReplicaSettings.from_env()


# -- the example: a sentiment classifier over MiniLM's embeddings (examples/classifier.py) -----------

POSITIVE = ["I really enjoyed this film, it was delightful.", "Fantastic service, I am thrilled!"]
NEGATIVE = ["The food was disgusting and the staff were rude.", "A dreadful, boring film. I regret it."]


@pytest.fixture(scope="module")
def sentiment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    directory = tmp_path_factory.mktemp("sentiment")
    mirror = {"BATCHD_MODEL_MIRROR": str(minilm_mirror(directory / "mirror"))}
    embedder = start_replica(EXAMPLES / "minilm.yaml", directory / "logs", env=mirror)
    calls = f"--call=embedder={embedder.url}"
    classifier = start_process(
        "sentiment", [*batchd_command(), "serve", str(EXAMPLES / "sentiment.yaml"), calls], directory / "logs"
    )
    with running([embedder, classifier]):
        yield embedder, classifier


async def test_the_example_classifies_over_embeddings_that_minilm_batches(
    sentiment: tuple[ServerProcess, ServerProcess],
) -> None:
    embedder, classifier = sentiment
    url = f"{classifier.url}/v1/models/sentiment:predict"
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=32), timeout=30) as client:
        first = await client.post(url, json={"instances": [POSITIVE[0]]})  # embeds the label examples
        assert first.status_code == 200, first.text
        before = batch_sizes(embedder)
        texts = (POSITIVE + NEGATIVE) * 8
        answers = await asyncio.gather(*(client.post(url, json={"instances": [text]}) for text in texts))
    assert {answer.status_code for answer in answers} == {200}, answers[0].text
    labels = [answer.json()["predictions"][0]["label"] for answer in answers]
    assert labels == (["positive"] * 2 + ["negative"] * 2) * 8
    embedded = batch_sizes(embedder).minus(before)
    assert embedded.sum == len(texts) and embedded.mean > 2, embedded.distribution()


# -- a composer's calls carry its request's class ---------------------------------------------------

RANKS = [{"name": "high", "priority": 10}, {"name": "low", "priority": 0}]
CALLEE_BATCH_S = 0.4


@pytest.fixture
def ranked(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """A slow callee (one item a batch, `CALLEE_BATCH_S` each) with a high and a low class, and a
    composer relaying to it whose classes add one the callee lacks (`bulk`)."""
    callee = manifest(
        "ranked-callee",
        {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": CALLEE_BATCH_S}},
        batching={
            "max_batch_size": 1,
            "batch_wait_timeout_s": 0,
            "priority_classes": RANKS,
            "default_priority_class": "low",
        },
    )
    composer = manifest(
        "ranked-composer",
        {"handler": "batchd.testing.batch_handlers:Relay", "calls": {"callee": "ranked-callee"}},
        batching={
            "max_batch_size": 1,
            "max_concurrent_batches": 8,
            "priority_classes": [*RANKS, {"name": "bulk", "priority": -1}],
            "default_priority_class": "low",
        },
    )
    served = start_replica(write_manifest(tmp_path, callee), tmp_path / "logs")
    serve = [
        *batchd_command(),
        "serve",
        str(write_manifest(tmp_path, composer)),
        f"--call=callee={served.url}",
    ]
    with running([served, start_process("ranked-composer", serve, tmp_path / "logs")]) as (
        callee_process,
        calling,
    ):
        yield callee_process, calling


async def test_a_composer_called_at_high_priority_is_served_ahead_of_the_callees_low_class_queue(
    ranked: tuple[ServerProcess, ServerProcess],
) -> None:
    callee, composer = ranked
    order: list[str] = []

    async def send(client: httpx.AsyncClient, url: str, name: str, **headers: str) -> httpx.Response:
        answer = await client.post(url, json={"instances": [{"to": "callee", "n": 1}]}, headers=headers)
        order.append(name)
        return answer

    def answered(name: str, _: object) -> None:
        order.append(name)

    direct = f"{callee.url}/v1/models/ranked-callee:predict"
    async with httpx.AsyncClient(timeout=60) as client:
        lows = [
            asyncio.ensure_future(
                client.post(direct, json={"instances": [n]}, headers={"batchd-priority": "low"})
            )
            for n in range(6)
        ]
        for n, low in enumerate(lows):
            low.add_done_callback(functools.partial(answered, f"low{n}"))
        await asyncio.to_thread(
            wait_until, lambda: callee.load()["queued_items"] == 5, 30, "the callee's low class queued"
        )
        through = f"{composer.url}/v1/models/ranked-composer:predict"
        urgent = await send(client, through, "composer", **{"batchd-priority": "high"})
        bulk = await send(client, through, "bulk", **{"batchd-priority": "bulk", "batchd-fairness-id": "t"})
        answers = await asyncio.gather(*lows)
    assert urgent.status_code == 200 and urgent.json()["predictions"] == [2], urgent.text
    assert [answer.status_code for answer in answers] == [200] * 6
    # FIFO would answer the composer's call after all six; its class put it next but one at most.
    assert order.index("composer") <= 2, order
    # A class the callee lacks is the callee's default there: served, not refused.
    assert bulk.status_code == 200, bulk.text
