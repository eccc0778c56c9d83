"""The OpenAI routes' bodies, for the OpenAPI document: what batchd reads and answers.

The handlers read requests with `requests` (so that a refusal names its field the same way
whatever the client); these models only describe them. Fields not listed are refused by name,
unless null or holding the value that asks for nothing.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from batchd.replica.front.protocols.cross_field import given, not_both, only_with
from batchd.replica.front.protocols.openai.requests import (
    MAX_CHOICES,
    MAX_COMPLETION_LOGPROBS,
    MAX_TOP_LOGPROBS,
)
from batchd.replica.generation.params import MAX_SEED

TokenIds = Annotated[list[int], Field(min_length=1)]
TextOrTokens = str | Annotated[list[str | TokenIds], Field(min_length=1)] | TokenIds


def _request_config(*rules: dict[str, Any]) -> ConfigDict:
    """A request's schema: the rules across its fields, and unknown fields refused unless null."""
    extra: dict[str, Any] = {"additionalProperties": {"type": "null"}}
    if rules:
        extra["allOf"] = list(rules)
    return ConfigDict(json_schema_extra=extra)


# best_of equal to n (1 where n is not given): one rule per n.
_BEST_OF_IS_N = [
    {
        "if": {"required": ["n"], "properties": {"n": {"const": n}}},
        "then": {"properties": {"best_of": {"enum": [None, n]}}},
    }
    for n in range(1, MAX_CHOICES + 1)
] + [{"if": {"not": given("n")}, "then": {"properties": {"best_of": {"enum": [None, 1]}}}}]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool | None = Field(default=None, description="A last event with the usage, no choices.")


class _Asking(BaseModel):
    """Who asks, and at which priority: what every request of these routes may say."""

    user: str | None = Field(
        default=None,
        description="The caller, for fair shares within its priority class (batchd-fairness-id wins).",
    )
    metadata: dict[str, str] | None = Field(
        default=None,
        max_length=16,
        description="`priority` names the request's priority class (the batchd-priority header wins).",
    )


class _Sampling(_Asking):
    model: str = Field(min_length=1, description="The served model name (GET /v1/models).")
    max_tokens: int | None = Field(
        default=None, ge=1, description="New tokens at most (model.generation.max_new_tokens bounds it)."
    )
    temperature: float | None = Field(default=None, ge=0, le=2, description="0 is greedy decoding.")
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES, description="Choices per prompt.")
    stop: str | list[str] | None = Field(default=None, description="Stop strings, cut from the answer.")
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED, description="Choice i samples with seed + i.")
    stream: bool | None = Field(default=None, description="Answer Server-Sent Events, ending data: [DONE].")
    stream_options: StreamOptions | None = None


class CompletionRequest(_Sampling):
    model_config = _request_config(only_with("stream_options", "stream", True), *_BEST_OF_IS_N)

    prompt: TextOrTokens = Field(description="A prompt, prompts, token ids or lists of token ids.")
    logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_COMPLETION_LOGPROBS,
        description="The chosen tokens' log-probabilities, with this many likeliest alternatives.",
    )
    best_of: int | None = Field(default=None, description="Only equal to n.")


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(json_schema_extra={"additionalProperties": {"type": "null"}})

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] = Field(description="Text, or text parts ({type: text, text}).")
    name: str | None = None


class ChatCompletionRequest(_Sampling):
    model_config = _request_config(
        only_with("stream_options", "stream", True),
        only_with("top_logprobs", "logprobs", True),
        not_both("max_tokens", "max_completion_tokens"),  # either way round: one rule
    )

    messages: list[ChatMessage] = Field(min_length=1, description="Written by the model's chat template.")
    max_completion_tokens: int | None = Field(default=None, ge=1, description="The same as max_tokens.")
    logprobs: bool | None = Field(default=None, description="The chosen tokens' log-probabilities.")
    top_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="Likeliest alternatives per token; with logprobs.",
    )


class PromptTokensDetails(BaseModel):
    cached_tokens: int = Field(
        description="Prompt tokens found in the replica's prefix cache (whole blocks of 16), not computed."
    )


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None = Field(
        default=None, description="Where asked: tokens, token_logprobs, top_logprobs, text_offset."
    )
    finish_reason: Literal["stop", "length"]


class _Answer(BaseModel):
    id: str
    created: int = Field(description="Unix seconds.")
    model: str
    usage: Usage


class CompletionResponse(_Answer):
    object: Literal["text_completion"]
    choices: list[CompletionChoice]


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None = Field(default=None, description="Where asked: content, one per token.")
    finish_reason: Literal["stop", "length"]


class ChatCompletionResponse(_Answer):
    object: Literal["chat.completion"]
    choices: list[ChatChoice]


class EmbeddingRequest(_Asking):
    model_config = _request_config()

    model: str = Field(min_length=1, description="The served model name (GET /v1/models).")
    input: TextOrTokens = Field(
        description="A text, texts, token ids or lists of token ids: one embedding each."
    )
    encoding_format: Literal["float", "base64"] | None = Field(
        default=None, description="base64: the little-endian float32 bytes."
    )
    dimensions: int | None = Field(
        default=None, ge=1, description="Only the model's own dimension is served."
    )


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
