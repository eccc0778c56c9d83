"""The direct path (`batchd.replica.front.direct`) answers a request of batch items (a KServe V1
prediction, the simple call) as the ASGI front would, byte for byte, and only the requests it is
meant for; whatever it does not take, and
whatever is pipelined behind it, uvicorn answers, in order.

Two replicas of the same model on real uvicorn over loopback, one with the direct path and one
without (as with `--access-log`), get the same raw HTTP requests; their answers are compared
whole, but for the `date` header.
"""

from __future__ import annotations

import asyncio
import gc
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from batchd.api.manifest import parse_manifest
from batchd.replica.front.app import create_app
from batchd.replica.front.server import replica_protocol
from batchd.replica.settings import ReplicaSettings
from batchd.testing.manifests import manifest
from batchd.testing.promtext import parse_counter
from batchd.testing.servers import uvicorn_in_thread

MODEL = "adder"
PREDICT = f"/v1/models/{MODEL}:predict"
MAX_BODY = 4096


class SeenByTheFront:
    """The replica's ASGI app, noting the HTTP requests that reach it (a direct one never does)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.replica = app.replica
        self.paths: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.paths.append(scope["path"])
        await self.app(scope, receive, send)


def serve(direct: bool, **batching: Any) -> Iterator[tuple[str, SeenByTheFront]]:
    handler = "batchd.testing.batch_handlers:add_one"
    document = manifest(MODEL, handler, batching={"max_batch_size": 8, "batch_wait_timeout_s": 0, **batching})
    front = create_app(parse_manifest(document), ReplicaSettings(max_body_bytes=MAX_BODY))
    app = SeenByTheFront(front)
    with uvicorn_in_thread(app, http=replica_protocol(front, access_log=not direct)) as url:
        yield url, app


@pytest.fixture(scope="module")
def direct() -> Iterator[tuple[str, SeenByTheFront]]:
    yield from serve(direct=True)


@pytest.fixture(scope="module")
def asgi() -> Iterator[tuple[str, SeenByTheFront]]:
    yield from serve(direct=False)


def request(body: bytes, path: str = PREDICT, headers: tuple[str, ...] = (), method: str = "POST") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: replica", *headers]
    if not any(header.lower().startswith("transfer-encoding") for header in headers):
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def exchange(url: str, data: bytes, answers: int) -> list[bytes]:
    """Send `data` on one connection and read back `answers` whole answers (heads and bodies)."""
    address = urlsplit(url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    try:
        writer.write(data)
        read = []
        async with asyncio.timeout(10):
            for _ in range(answers):
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"\r\ncontent-length: (\d+)\r\n", head, re.IGNORECASE)
                assert length is not None, head
                read.append(head + await reader.readexactly(int(length.group(1))))
        return read
    finally:
        writer.close()


def undated(answer: bytes) -> bytes:
    return re.sub(rb"\r\ndate: [^\r]*", b"", answer)


# Requests the direct path takes, each answered by it; and requests it leaves to the front.
TAKEN = {
    "one instance": request(b'{"instances": [1]}'),
    "several": request(b'{"instances": [1, 2, 3]}'),
    "the client's deadline": request(b'{"instances": [4]}', headers=("batchd-timeout-s: 5",)),
    "connection: close": request(b'{"instances": [5]}', headers=("connection: close",)),
    "not json": request(b"{not json"),
    "empty body": request(b""),
    "no instances": request(b'{"inputs": [1]}'),
    "instances not a list": request(b'{"instances": 3}'),
    "no items": request(b'{"instances": []}'),
    "an item the model refuses": request(b'{"instances": [1, "abc"]}'),
    "more items than ever fit": request(b'{"instances": [' + b",".join([b"1"] * 1100) + b"]}"),
    "a bad client deadline": request(b'{"instances": [1]}', headers=("batchd-timeout-s: soon",)),
    "another model": request(b'{"instances": [1]}', path="/v1/models/other:predict"),
    "a simple call with no item": request(b"", path="/"),
}
LEFT = {
    "a query string": request(b'{"instances": [1]}', path=PREDICT + "?x=1"),
    "a body past max_body_bytes": request(b'{"instances": [' + b",".join([b"1"] * 2100) + b"]}"),
    "a chunked body": request(
        b'12\r\n{"instances": [1]}\r\n0\r\n\r\n', headers=("transfer-encoding: chunked",)
    ),
    "another route": request(b"", path="/v2/health/ready", method="GET"),
}


@pytest.mark.parametrize("name", list(TAKEN) + list(LEFT))
async def test_the_direct_path_answers_as_the_front_does(
    direct: tuple[str, SeenByTheFront], asgi: tuple[str, SeenByTheFront], name: str
) -> None:
    data = TAKEN.get(name) or LEFT[name]
    (direct_url, direct_app), (asgi_url, asgi_app) = direct, asgi
    direct_app.paths.clear()
    asgi_app.paths.clear()
    (expected,) = await exchange(asgi_url, data, 1)
    (answer,) = await exchange(direct_url, data, 1)
    assert undated(answer) == undated(expected)
    assert len(asgi_app.paths) == 1  # the comparison means something: the front answered there ...
    assert len(direct_app.paths) == (0 if name in TAKEN else 1)  # ... and here only what is left to it


async def test_both_paths_count_the_same_outcomes(
    direct: tuple[str, SeenByTheFront], asgi: tuple[str, SeenByTheFront]
) -> None:
    def counts(url: str) -> dict[str, float]:
        text = httpx.get(f"{url}/metrics").text
        found = re.findall(r'^batchd_requests_total\{[^}]*outcome="(\w+)"[^}]*\} (\S+)$', text, re.MULTILINE)
        return {outcome: float(value) for outcome, value in found}

    before = [counts(url) for url, _ in (direct, asgi)]
    for data in TAKEN.values():
        await asyncio.gather(*(exchange(url, data, 1) for url, _ in (direct, asgi)))
    grown = [
        {outcome: value - earlier.get(outcome, 0.0) for outcome, value in counts(url).items()}
        for (url, _), earlier in zip((direct, asgi), before, strict=True)
    ]
    assert grown[0] == grown[1]
    assert grown[0]["success"] == 4 and sum(grown[0].values()) == len(TAKEN), grown[0]  # each counted once


async def test_requests_pipelined_behind_a_direct_one_are_answered_in_order(
    direct: tuple[str, SeenByTheFront],
) -> None:
    url, app = direct
    app.paths.clear()
    pipelined = [
        request(b'{"instances": [1]}'),
        request(b"", path="/v2/health/ready", method="GET"),
        request(b'{"instances": [2]}'),
        request(b'{"instances": [3]}', path=f"/v1/models/{MODEL}:predict?x=1"),
        request(b'{"instances": [4]}'),
    ]
    answers = await exchange(url, b"".join(pipelined), len(pipelined))
    bodies = [answer.split(b"\r\n\r\n", 1)[1] for answer in answers]
    assert bodies == [
        b'{"predictions":[2]}',
        b'{"ready":true}',
        b'{"predictions":[3]}',
        b'{"predictions":[4]}',
        b'{"predictions":[5]}',
    ]
    # The first went direct; what came behind it while it was in flight went to the front.
    assert PREDICT in app.paths and len(app.paths) < len(pipelined)


async def test_a_client_gone_before_its_body_is_complete_is_counted_and_the_replica_serves_on(
    direct: tuple[str, SeenByTheFront],
) -> None:
    url, _ = direct
    before = parse_counter(httpx.get(f"{url}/metrics").text, "batchd_requests", {"outcome": "cancelled"})
    address = urlsplit(url)
    _, writer = await asyncio.open_connection(address.hostname, address.port)
    writer.write(request(b'{"instances": [1]}')[:-5])  # the body cut short
    await writer.drain()
    writer.close()

    def cancelled() -> float:
        return parse_counter(httpx.get(f"{url}/metrics").text, "batchd_requests", {"outcome": "cancelled"})

    async with asyncio.timeout(10):
        while cancelled() == before:
            await asyncio.sleep(0.02)
    assert cancelled() == before + 1
    (answer,) = await exchange(url, request(b'{"instances": [6]}'), 1)
    assert answer.endswith(b'{"predictions":[7]}')


async def test_an_answered_direct_request_leaves_nothing_for_the_garbage_collector(
    direct: tuple[str, SeenByTheFront],
) -> None:
    # A cycle left by each request (the door and its exchange holding each other) is freed only
    # by the collector, whose runs then cost the replica a share of every request.
    url, _ = direct
    gc.collect()
    flags = gc.get_debug()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        answers = await exchange(url, TAKEN["one instance"] * 50, 50)
        assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers)
        gc.collect()
        left = {type(found).__name__ for found in gc.garbage} & {"Exchange", "_Prediction", "Submitted"}
    finally:
        gc.garbage.clear()
        gc.set_debug(flags)
        gc.enable()
    assert not left, f"each request leaves a cycle of {sorted(left)}"
