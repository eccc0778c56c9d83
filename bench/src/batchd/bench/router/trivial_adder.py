"""A trivial adder in raw ASGI: the cheapest upstream there is, so that what is measured is the router.

    uvicorn batchd.bench.router.trivial_adder:app --loop uvloop --http httptools

It answers `GET /load` as an idle, ready replica does, so the router's load poller reads it too.
"""

from __future__ import annotations

from typing import Any

import orjson

from batchd.bench.kit.asgi import read_body

_HEADERS = [(b"content-type", b"application/json")]
_IDLE = b'{"ready": true, "queued_items": 0, "running_items": 0}'


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = await read_body(receive)
    if scope["path"] == "/load":
        answer = _IDLE
    else:
        answer = orjson.dumps({"predictions": [n + 1 for n in orjson.loads(body)["instances"]]})
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": answer})
