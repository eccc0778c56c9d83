"""The Open Inference Protocol's generate extension: text in, text out, whole or streamed.

`POST /v2/models/{name}/generate` answers one JSON object; `/generate_stream` answers Server-Sent
Events, one `data:` event per piece of new text as the model makes it, the last with `"done":
true`. Both take `{"text_input": "...", "parameters": {...}}` (the parameters are read by
`batchd.replica.generation.params`; `details: true` adds the new tokens' ids). Errors before the
first token are ordinary error answers (status and `{"error": ...}`); an error after it, when the
status line is long gone, is a last event `{"error": ...}`, as the extension specifies.

Both routes are endpoints (answered in front of FastAPI, see `asgi`): their handlers, and
the pure functions that read requests and write answers.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from batchd.api.routes import V2_GENERATE, V2_GENERATE_STREAM
from batchd.replica.errors import InvalidInput, describe
from batchd.replica.front.endpoints import Call, Endpoint, Streaming
from batchd.replica.front.protocols.cross_field import not_both
from batchd.replica.generation.params import MAX_SEED, Chunk, Completion, GenerationRequest

if TYPE_CHECKING:  # the generation service imports torch, which only text-generation replicas need
    from batchd.replica.generation.service import GenerationService

TAG = "Open Inference Protocol V2: generate extension"

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # proxies (nginx) must not hold events back
]


class GenerateParameters(BaseModel):
    """Per-request generation parameters, within the limits the spec sets (beyond one: 400)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"allOf": [not_both("max_tokens", "max_new_tokens")]}
    )

    max_tokens: int | None = Field(default=None, ge=1, description="New tokens at most (or max_new_tokens).")
    max_new_tokens: int | None = Field(default=None, ge=1, description="The same as max_tokens.")
    min_new_tokens: int | None = Field(
        default=None, ge=0, description="End-of-sequence held back until then."
    )
    temperature: float | None = Field(default=None, ge=0, le=2, description="0 (default) is greedy decoding.")
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0, description="0: no top-k filter.")
    do_sample: bool | None = Field(default=None, description="false: greedy whatever the temperature.")
    seed: int | None = Field(
        default=None, ge=0, le=MAX_SEED, description="Sampled text depends on the seed alone."
    )
    stop: str | list[str] | None = Field(default=None, description="Stop strings, cut from the answer.")
    details: bool | None = Field(default=None, description="Add the new tokens' ids to the answer.")


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown field is refused by name
    text_input: str = Field(min_length=1, description="The prompt.")
    parameters: GenerateParameters | None = None
    id: str | None = None


class GenerateResponse(BaseModel):
    model_name: str
    id: str | None = None
    text_output: str = Field(description="The new text (the prompt is not repeated).")
    finish_reason: str = Field(
        description="length (max_tokens reached) or stop (end of sequence, stop string)."
    )
    prompt_tokens: int
    generated_tokens: int
    token_ids: list[int] | None = Field(default=None, description="With details: the new tokens.")


class GenerateStreamEvent(BaseModel):
    model_name: str
    id: str | None = None
    text_output: str = Field(description="The text since the previous event.")
    done: bool
    finish_reason: str | None = Field(default=None, description="On the last event.")
    generated_tokens: int | None = Field(default=None, description="On the last event.")
    token_ids: list[int] | None = Field(default=None, description="With details: this event's tokens.")


async def generate(call: Call) -> dict[str, Any]:
    name, service, request, request_id, details = _prepared(call)
    (completion,) = await service.complete([request], call.client)
    return answer(name, request_id, completion, details)


async def generate_stream(call: Call) -> AsyncGenerator[bytes, None]:
    """Events as the text is made; what came while the client was being written to goes in one write."""
    name, service, request, request_id, details = _prepared(call)
    async with service.open(request, call.client) as stream:
        async for first in stream:
            yield b"".join(
                event(name, request_id, chunk, stream.generated_tokens, details)
                for chunk in (first, *stream.ready())
                if chunk.text or chunk.finish_reason or details
            )


def _prepared(call: Call) -> tuple[str, GenerationService, GenerationRequest, str | None, bool]:
    """A generate request decoded: the model's name, the service, the prepared request, its id
    and `details`."""
    text, parameters, request_id, details = decode_request(call.json())
    name = call.replica.model_name if call.model_name is None else call.model_name
    service = call.replica.generator(name)
    return name, service, service.preparer.prepare(text, parameters, "text_input"), request_id, details


def decode_request(body: Any) -> tuple[str, dict[str, Any] | None, str | None, bool]:
    """(text_input, parameters, id, details) of a generate request, or InvalidInput naming the field."""
    if not isinstance(body, dict):
        raise InvalidInput(
            f"request body: expected a JSON object with 'text_input', got {type(body).__name__}"
        )
    for key in body:
        if key not in ("text_input", "parameters", "id"):
            raise InvalidInput(f"{key}: unknown field; expected text_input, parameters and id")
    text = body.get("text_input")
    if not isinstance(text, str):
        raise InvalidInput(f"text_input: required, a string; got {text!r:.60}")
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput(f"id: expected a string, got {request_id!r:.60}")
    parameters = body.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise InvalidInput(f"parameters: expected an object, got {parameters!r:.60}")
    details = False
    if parameters is not None and "details" in parameters:
        parameters = dict(parameters)
        details = parameters.pop("details")
        if details is None:  # as every optional parameter: null is not given
            details = False
        elif not isinstance(details, bool):
            raise InvalidInput(f"parameters.details: expected true or false, got {details!r:.60}")
    return text, parameters, request_id, details


def answer(model_name: str, request_id: str | None, completion: Completion, details: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model_name": model_name}
    if request_id is not None:
        body["id"] = request_id
    body |= {
        "text_output": completion.text,
        "finish_reason": completion.finish_reason,
        "prompt_tokens": completion.prompt_tokens,
        "generated_tokens": completion.generated_tokens,
    }
    if details:
        body["token_ids"] = list(completion.token_ids)
    return body


def event(model_name: str, request_id: str | None, chunk: Chunk, generated: int, details: bool) -> bytes:
    """One Server-Sent Event for one chunk (`generated`: the request's new tokens so far)."""
    body: dict[str, Any] = {"model_name": model_name}
    if request_id is not None:
        body["id"] = request_id
    body |= {"text_output": chunk.text, "done": chunk.finish_reason is not None}
    if chunk.finish_reason is not None:
        body |= {"finish_reason": chunk.finish_reason, "generated_tokens": generated}
    if details:
        body["token_ids"] = list(chunk.token_ids)
    return b"data: " + orjson.dumps(body) + b"\n\n"


def error_event(error: BaseException) -> bytes:
    return b"data: " + orjson.dumps({"error": describe(error)}) + b"\n\n"


ENDPOINTS = (
    Endpoint(
        V2_GENERATE,
        summary="Generate (Open Inference Protocol generate extension)",
        tag=TAG,
        answer=generate,
        request=GenerateRequest,
        response=GenerateResponse,
    ),
    Endpoint(
        V2_GENERATE_STREAM,
        summary="Generate, streamed (Open Inference Protocol generate extension)",
        tag=TAG,
        streaming=Streaming(
            events=generate_stream,
            headers=SSE_HEADERS,
            error_event=error_event,
            media_type="text/event-stream",
            description="Server-Sent Events: `data: {GenerateStreamEvent}` as text is made; the last "
            'has done: true. An error after the first event is a last event {"error": "..."}.',
        ),
        request=GenerateRequest,
    ),
)
