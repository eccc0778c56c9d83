"""Keep-alive connections end after a bounded number of requests or a bounded age, on a real
`batchd serve` process and a real keep-alive client (aiohttp): the answer past the bound says
`Connection: close`, the client's next request opens a new connection, and nothing in flight (a
long request, a stream) is ever cut.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import orjson
import pytest

from batchd.replica.front.keepalive import ends_connection
from batchd.testing.manifests import manifest
from batchd.testing.models import build_gpt2
from batchd.testing.servers import ServerProcess, replica_process, write_manifest

SLOW_S = 1.0
TOKENS = 40  # a stream of this many tokens takes far longer than the age bound
PREDICT = "/v1/models/adder:predict"


def test_the_rule_ends_a_connection_at_either_bound_and_zero_is_no_bound() -> None:
    assert not ends_connection(999, 1.0, max_requests=1000, max_age_s=5.0)
    assert ends_connection(1000, 1.0, max_requests=1000, max_age_s=5.0)
    assert ends_connection(2, 5.0, max_requests=1000, max_age_s=5.0)
    assert not ends_connection(10**6, 10**6, max_requests=0, max_age_s=0)


def adder(delay_s: float = 0.0) -> dict[str, Any]:
    handler = {"handler": "batchd.testing.batch_handlers:SlowAdder", "init_kwargs": {"delay_s": delay_s}}
    return manifest("adder", handler, batching={"max_batch_size": 8, "batch_wait_timeout_s": 0})


@pytest.fixture
def bounded(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """A replica of the adder with the keep-alive bounds (and batch delay) of the test's parameter."""
    max_requests, max_age_s, delay_s = request.param
    env = {"BATCHD_KEEPALIVE_MAX_REQUESTS": str(max_requests), "BATCHD_KEEPALIVE_MAX_AGE_S": str(max_age_s)}
    with replica_process(write_manifest(tmp_path, adder(delay_s)), tmp_path, env=env) as replica:
        yield replica


@asynccontextmanager
async def one_connection_client(url: str) -> AsyncIterator[tuple[aiohttp.ClientSession, list[bool]]]:
    """A keep-alive client with a pool of one connection, and the list that says, per request,
    whether it went out on a new connection."""
    opened: list[bool] = []
    tracing = aiohttp.TraceConfig()

    async def started(session: Any, context: SimpleNamespace, params: Any) -> None:
        opened.append(False)

    async def created(session: Any, context: SimpleNamespace, params: Any) -> None:
        opened[-1] = True

    tracing.on_request_start.append(started)
    tracing.on_connection_create_end.append(created)
    connector = aiohttp.TCPConnector(limit=1)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(
        url, connector=connector, timeout=timeout, trace_configs=[tracing]
    ) as session:
        yield session, opened


async def predict(session: aiohttp.ClientSession, n: int) -> str:
    """The answer's Connection header ("" when absent), after checking the answer."""
    async with session.post(PREDICT, json={"instances": [n]}) as response:
        assert response.status == 200, await response.text()
        assert (await response.json())["predictions"] == [n + 1]
        return response.headers.get("Connection", "").lower()


@pytest.mark.slow
@pytest.mark.parametrize("bounded", [(5, 0, 0.0)], indirect=True)
async def test_a_connection_ends_after_max_requests(bounded: ServerProcess) -> None:
    async with one_connection_client(bounded.url) as (session, opened):
        closing = [await predict(session, n) == "close" for n in range(12)]
    assert closing == [n % 5 == 4 for n in range(12)]
    assert opened == [n % 5 == 0 for n in range(12)]  # the next request goes on a new connection


@pytest.mark.slow
@pytest.mark.parametrize("bounded", [(0, 0.5, 0.0)], indirect=True)
async def test_a_connection_ends_once_it_is_max_age_old(bounded: ServerProcess) -> None:
    async with one_connection_client(bounded.url) as (session, opened):
        first = time.monotonic()
        answers = [await predict(session, 0)]
        while answers[-1] != "close":
            assert time.monotonic() - first < 10, "no Connection: close within 10 s of a 0.5 s age bound"
            answers.append(await predict(session, len(answers)))
        age_s = time.monotonic() - first
        await predict(session, 1)
    assert age_s >= 0.45  # the bound, less its jitter
    assert len(answers) > 1 and opened[0] and not any(opened[1 : len(answers)])
    assert opened[-1]  # after the close: a new connection


@pytest.mark.slow
@pytest.mark.parametrize("bounded", [(1, 0.1, SLOW_S)], indirect=True)
async def test_a_long_request_past_both_bounds_is_answered_in_full(bounded: ServerProcess) -> None:
    async with one_connection_client(bounded.url) as (session, opened):
        started = time.monotonic()
        assert await predict(session, 7) == "close"  # answered, then closed
        assert time.monotonic() - started >= SLOW_S * 0.9
        assert await predict(session, 8) == "close"
    assert opened == [True, True]


@pytest.mark.slow
async def test_a_stream_longer_than_the_age_bound_is_not_cut(tmp_path: Path) -> None:
    model = {
        "task": "text-generation",
        "source": f"file://{build_gpt2(tmp_path / 'tiny-gpt2')}",
        "device": "cpu",
    }
    document = manifest("gpt2", {**model, "generation": {"max_new_tokens": TOKENS}})
    env = {"BATCHD_KEEPALIVE_MAX_REQUESTS": "1", "BATCHD_KEEPALIVE_MAX_AGE_S": "0.05"}
    parameters = {"temperature": 0, "max_tokens": TOKENS, "min_new_tokens": TOKENS}
    with replica_process(write_manifest(tmp_path, document), tmp_path, env=env) as replica:
        async with one_connection_client(replica.url) as (session, _):
            body = {"text_input": "Once upon a time", "parameters": parameters}
            async with session.post("/v2/models/gpt2/generate_stream", json=body) as response:
                assert response.status == 200
                assert response.headers["Connection"].lower() == "close"
                events = [
                    orjson.loads(line[5:]) async for line in response.content if line.startswith(b"data:")
                ]
    assert not any("error" in event for event in events), events[-3:]
    assert events[-1]["done"] and events[-1]["generated_tokens"] == TOKENS  # to the end: nothing cut
