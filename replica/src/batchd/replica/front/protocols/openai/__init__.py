"""OpenAI's API: `/v1/completions`, `/v1/chat/completions` and `/v1/embeddings`, on the same
batching as every other route.

Requests are read by `requests` (every unsupported field refused by name), run by `completions`
(the generation service) and `embeddings` (the batcher), and answered by `answers`, streamed as
OpenAI's Server-Sent Events where the request says `stream: true`. Errors come in OpenAI's shape
(`{"error": {"message", "type", "param", "code"}}`) with the statuses of the error table: overload
is 503 with Retry-After, which the openai client retries after the time it is told.
The model listing (`GET /v1/models`) is `models`.
"""

from __future__ import annotations

from pydantic import BaseModel

from batchd.api.routes import OPENAI_CHAT_COMPLETIONS, OPENAI_COMPLETIONS, OPENAI_EMBEDDINGS, Route
from batchd.replica.errors import OpenAIErrorBody, openai_error_body
from batchd.replica.front.endpoints import Answerer, Endpoint
from batchd.replica.front.protocols.openai import schemas
from batchd.replica.front.protocols.openai.completions import chat_completions, completions
from batchd.replica.front.protocols.openai.embeddings import embeddings

TAG = "OpenAI"
_STREAMED = (
    "With stream: true, Server-Sent Events instead: data: {chunk} as text is made, then data: [DONE]; "
    "an error after the first event is a last data: {error} event."
)


def _endpoint(
    route: Route,
    summary: str,
    answer: Answerer,
    request: type[BaseModel],
    response: type[BaseModel],
    streams: bool,
) -> Endpoint:
    return Endpoint(
        route,
        summary=summary,
        tag=TAG,
        answer=answer,
        request=request,
        response=response,
        error_body=openai_error_body,
        error_schema=OpenAIErrorBody,
        streamed_description=_STREAMED if streams else None,
    )


ENDPOINTS = (
    _endpoint(
        OPENAI_COMPLETIONS,
        "Completions (OpenAI)",
        completions,
        schemas.CompletionRequest,
        schemas.CompletionResponse,
        streams=True,
    ),
    _endpoint(
        OPENAI_CHAT_COMPLETIONS,
        "Chat completions (OpenAI)",
        chat_completions,
        schemas.ChatCompletionRequest,
        schemas.ChatCompletionResponse,
        streams=True,
    ),
    _endpoint(
        OPENAI_EMBEDDINGS,
        "Embeddings (OpenAI)",
        embeddings,
        schemas.EmbeddingRequest,
        schemas.EmbeddingResponse,
        streams=False,
    ),
)
