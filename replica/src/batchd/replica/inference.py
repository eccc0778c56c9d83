"""The inference routes, answered in plain ASGI in front of the FastAPI app.

Every request to a batching server pays the framework's per-request cost, and with a cheap
model that cost is the throughput: FastAPI's middleware and dependency layers took about
three quarters of the time per request on the trivial handler. So the inference routes (KServe
V1, Open Inference V2 and its generate extension, the seeds' simple call) are matched here by
plain string tests and answered directly; everything else (health, metadata, /metrics, /docs) falls through to
FastAPI, where convenience matters more than microseconds.

What every inference request goes through, whatever its protocol: read the body (bounded),
decode it into items, queue them, wait for the results (bounded by `request_timeout_s`, and
given up when the client disconnects), encode the answer, count the outcome.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from batchd.replica.errors import ClientDisconnected, InvalidInput, TooLarge, answer_for, describe, http_error
from batchd.replica.protocols import generate, kserve_v1, simple
from batchd.replica.protocols.generate import SSE_HEADERS
from batchd.replica.protocols.v2_tensors import (
    decode_inputs,
    encode_outputs,
    shape_answer,
    split_body,
    wanted_outputs,
)
from batchd.replica.serving import Replica

if TYPE_CHECKING:  # the generation package imports torch
    from batchd.replica.generation.params import GenerationRequest
    from batchd.replica.generation.service import GenerationService

logger = logging.getLogger(__name__)

_JSON_HEADERS = [(b"content-type", b"application/json")]


@dataclass(frozen=True, slots=True)
class _Call:
    """One matched inference request: which protocol, and the model name in its URL."""

    protocol: str  # "v1" | "v2" | "generate" | "generate_stream" | "simple"
    name: str | None


_V2_SUFFIXES = (("/infer", "v2"), ("/generate", "generate"), ("/generate_stream", "generate_stream"))


def match(method: str, path: str) -> _Call | None:
    """The inference route a request is for, by plain string tests (no regex on the hot path)."""
    if method == "POST":
        if path.startswith("/v1/models/") and path.endswith(":predict"):
            return _Call("v1", path[len("/v1/models/") : -len(":predict")])
        if path.startswith("/v2/models/"):
            for suffix, protocol in _V2_SUFFIXES:
                if path.endswith(suffix):
                    return _Call(protocol, path[len("/v2/models/") : -len(suffix)])
    if path == "/" and method in ("GET", "POST"):
        return _Call("simple", None)
    return None


class InferenceRoutes:
    """ASGI: answers the inference routes itself and hands every other request to `app`."""

    def __init__(self, app: ASGIApp, replica: Replica) -> None:
        self.app = app
        self.replica = replica
        self._max_body = replica.settings.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.replica.batcher.draining and scope["type"] == "http":
            send = _closing(send)  # every answer from now on tells the client to leave (see shutdown)
        call = match(scope["method"], scope["path"]) if scope["type"] == "http" else None
        if call is None:
            await self.app(scope, receive, send)
            return
        if call.protocol == "generate_stream":
            await self._stream(call, receive, send)
            return
        replica = self.replica
        started = time.perf_counter()
        replica.inflight += 1
        try:
            payload = await self._answer(call, scope, receive)
        except Exception as error:
            answer = answer_for(error)
            replica.metrics.request_done(answer.outcome, time.perf_counter() - started)
            if answer.rejection:
                replica.metrics.rejected(answer.rejection)
            await _send_error(send, error)
            return
        finally:
            replica.inflight -= 1
        replica.metrics.request_done("success", time.perf_counter() - started)
        if isinstance(payload, BinaryAnswer):
            await payload.send(send)
        else:
            await _send_json(send, 200, payload)

    async def _answer(self, call: _Call, scope: Scope, receive: Receive) -> Any:
        body = await _read_body(receive, self._max_body)
        if call.protocol == "simple":
            item = simple.item_from_query(parse_qsl(scope["query_string"].decode("latin-1")))
            (result,) = await self._infer(self.replica.model_name, [item], "query", receive)
            return result
        if call.protocol == "v1":
            instances = kserve_v1.decode_instances(_parse_json(body))
            return {"predictions": await self._infer(call.name, instances, "instances", receive)}
        if call.protocol == "generate":
            assert call.name is not None
            service, request, request_id, details = self._generation(call.name, body)
            (completion,) = await service.complete([request], partial(_disconnected, receive))
            return generate.answer(call.name, request_id, completion, details)
        header, binary = split_body(body, _header(scope, b"inference-header-content-length"))
        document = _parse_json(header)
        items = decode_inputs(document, binary)
        wanted = wanted_outputs(document)
        results = await self._infer(call.name, items, "inputs", receive)
        outputs, raw = shape_answer(encode_outputs(results, self.replica.output_specs), wanted)
        answer: dict[str, Any] = {"model_name": call.name, "outputs": outputs}
        if isinstance(document.get("id"), str):
            answer["id"] = document["id"]
        return BinaryAnswer(orjson.dumps(answer), raw) if raw else answer

    async def _stream(self, call: _Call, receive: Receive, send: Send) -> None:
        """`generate_stream`: Server-Sent Events as the text is made. The status line goes with the
        first piece of text, so that anything that fails before it is an ordinary error answer."""
        replica = self.replica
        started = time.perf_counter()
        replica.inflight += 1
        outcome = "success"
        streaming = False
        try:
            assert call.name is not None
            body = await _read_body(receive, self._max_body)
            service, request, request_id, details = self._generation(call.name, body)
            async with service.open(request, partial(_disconnected, receive)) as stream:
                async for first in stream:
                    if not streaming:
                        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
                        streaming = True
                    # What came while the client was being written to goes in one write.
                    events = [
                        generate.event(call.name, request_id, chunk, stream.generated_tokens, details)
                        for chunk in (first, *stream.ready())
                        if chunk.text or chunk.finish_reason or details
                    ]
                    if events:
                        await send(
                            {"type": "http.response.body", "body": b"".join(events), "more_body": True}
                        )
            await send({"type": "http.response.body", "body": b""})
        except Exception as error:
            answer = answer_for(error)
            outcome = answer.outcome
            if answer.rejection:
                replica.metrics.rejected(answer.rejection)
            if not streaming:
                await _send_error(send, error)
            else:  # the status line is gone: the error is the last event
                if outcome == "error":
                    logger.error("stream failed: %s", describe(error))
                await send({"type": "http.response.body", "body": generate.error_event(error)})
        finally:
            replica.inflight -= 1
            replica.metrics.request_done(outcome, time.perf_counter() - started)

    def _generation(
        self, name: str, body: bytes
    ) -> tuple[GenerationService, GenerationRequest, str | None, bool]:
        """A generate request decoded: the service, the prepared request, its id and `details`."""
        text, parameters, request_id, details = generate.decode_request(_parse_json(body))
        service = self.replica.generator(name)
        return service, service.preparer.prepare(text, parameters, "text_input"), request_id, details

    async def _infer(self, name: str | None, items: list[Any], field: str, receive: Receive) -> list[Any]:
        """Batch the items with everybody else's; a client that leaves cancels what has not run."""
        if name is not None:
            self.replica.check_name(name)
        return await self.replica.infer(items, field, partial(_disconnected, receive))


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone (the body has been read, so nothing else can arrive)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected("the client went away while sending its request")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"request body: more than the {limit} bytes this replica accepts")
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def _parse_json(body: bytes) -> Any:
    if not body:
        raise InvalidInput("request body: empty; expected JSON")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise InvalidInput(f"request body: not valid JSON: {error}") from None


@dataclass(frozen=True, slots=True)
class BinaryAnswer:
    """A V2 answer with binary tensor data: the JSON header, then the tensors' bytes."""

    header: bytes
    data: bytes

    async def send(self, send: Send) -> None:
        headers = [
            (b"content-type", b"application/octet-stream"),
            (b"inference-header-content-length", str(len(self.header)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self.header + self.data})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _closing(send: Send) -> Send:
    """`send`, with `Connection: close` on the response: the client reconnects elsewhere."""

    async def send_closing(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)

    return send_closing


async def _send_json(
    send: Send, status: int, payload: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)
    await send({"type": "http.response.start", "status": status, "headers": headers or _JSON_HEADERS})
    await send({"type": "http.response.body", "body": body})


async def _send_error(send: Send, error: Exception) -> None:
    if answer_for(error).outcome == "error":
        logger.error("request failed: %s", describe(error))
    answer = http_error(error)
    await _send_json(send, answer.status, answer.body, answer.headers)
