"""What the router answers itself, besides forwarding: on the clients' port `/healthz`, `/readyz`
and the 404 that says what it forwards; on the admin port (`admin_port`) `GET /held` (what waits
for a first replica, for the operator) and `/metrics` (for the scraper), which no client reaches:
what is held and the deployments' counts are not a client's to read."""

from __future__ import annotations

from collections.abc import Callable

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from batchd.router.client_request import Send
from batchd.router.errors import NoRoute, http_answer
from batchd.router.holding import Holds
from batchd.router.metrics import RouterMetrics
from batchd.router.settings import RouterSettings

JSON = [(b"content-type", b"application/json")]
ROUTES_HELP = (
    "the inference routes that name a model (POST /v1/models/NAME:predict, /v2/models/NAME/infer, ...)"
)


async def answer_admin(
    method: str, path: str, send: Send, *, holds: Holds, metrics: RouterMetrics, settings: RouterSettings
) -> None:
    """The admin port's answers: `GET /held`, `GET /metrics`, `GET /healthz`; 404 for the rest."""
    if method == "GET" and path == "/held":
        await send_answer(send, 200, orjson.dumps({"deployments": holds.snapshot()}), JSON)
    elif method == "GET" and path == "/metrics":
        headers = [(b"content-type", CONTENT_TYPE_LATEST.encode())]
        await send_answer(send, 200, generate_latest(metrics.registry), headers)
    elif method == "GET" and path == "/healthz":
        await send_answer(send, 200, b'{"live":true}', JSON)
    else:
        answer = http_answer(
            NoRoute(f"no route for {method} {path}; the admin port serves GET /held, /metrics, /healthz"),
            settings,
        )
        await send_answer(send, answer.status, answer.body, answer.headers)


async def answer_own(
    method: str, path: str, send: Send, *, ready: Callable[[], bool], settings: RouterSettings
) -> None:
    """The clients' port's own answers: health and readiness, and a 404 naming what it forwards."""
    if method == "GET" and path == "/healthz":
        await send_answer(send, 200, b'{"live":true}', JSON)
    elif method == "GET" and path == "/readyz":
        is_ready = ready()
        await send_answer(send, 200 if is_ready else 503, orjson.dumps({"ready": is_ready}), JSON)
    else:
        answer = http_answer(
            NoRoute(f"no route for {method} {path}; the router forwards {ROUTES_HELP}"), settings
        )
        await send_answer(send, answer.status, answer.body, answer.headers)


async def send_answer(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
