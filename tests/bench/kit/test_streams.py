"""A streamed answer is kept event by event with when each came; a refusal keeps its status and
headers, and an answer that broke off says so."""

from __future__ import annotations

import asyncio
from typing import Any

from batchd.bench.kit import streams
from batchd.testing.asgi import read_body
from batchd.testing.servers import uvicorn_in_thread


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await read_body(receive)
    if scope["path"] == "/refuse":
        headers = [(b"content-type", b"text/plain"), (b"batchd-refused", b"shed")]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": b"busy"})
        return
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    )
    for event in (b'{"text": "a"}', b'{"text": "b"}', b"[DONE]"):
        await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b"data: " + event + b"\n\n", "more_body": True})
    if scope["path"] == "/break":
        raise RuntimeError("the server gave up mid-answer")
    await send({"type": "http.response.body", "body": b""})


async def _ask(url: str, path: str) -> streams.Streamed:
    async with streams.session(10) as session:
        return await streams.stream(session, url + path, {"prompt": "x"})


def test_an_answer_is_kept_event_by_event_and_a_refusal_with_its_headers() -> None:
    with uvicorn_in_thread(_app, wait_ready=False) as url:
        whole = asyncio.run(_ask(url, "/"))
        refused = asyncio.run(_ask(url, "/refuse"))
        broken = asyncio.run(_ask(url, "/break"))
    assert whole.status == 200 and [payload for _, payload in whole.events] == [
        b'{"text": "a"}',
        b'{"text": "b"}',
        b"[DONE]",
    ]
    assert whole.first_s is not None and whole.done_s is not None and whole.first_s < whole.events[1][0]
    assert whole.last == b"[DONE]" and whole.error is None
    assert refused.status == 503 and refused.done_s is None and refused.error == "503: busy"
    assert refused.headers.get("batchd-refused") == "shed"
    assert broken.status == 200 and broken.done_s is None and broken.error is not None


def test_the_open_loop_sends_each_item_when_it_is_due_never_before() -> None:
    async def run() -> list[tuple[str, float, float]]:
        loop = asyncio.get_running_loop()

        async def send(start: float, due_s: float, item: str) -> tuple[str, float, float]:
            return item, due_s, loop.time() - start

        return await streams.open_loop([(0.05, "b"), (0.0, "a")], send)

    sent = asyncio.run(run())
    assert [item for item, _, _ in sent] == ["b", "a"]  # answers in the order given
    assert all(at_s >= due_s for _, due_s, at_s in sent)
