"""OpenAI answer bodies and Server-Sent Events, written from what the model made: pure functions.

Completions answer `text_completion` objects, chat `chat.completion` ones; streamed, each event
is a `...chunk` object on a `data:` line, and the stream ends with `data: [DONE]`, as OpenAI's
streams do. With `stream_options.include_usage`, every event carries `"usage": null` and one
last event before `[DONE]` has no choices and the request's usage.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from batchd.replica.errors import openai_error_body
from batchd.replica.generation.params import Completion, TokenLogprob

DONE = b"data: [DONE]\n\n"
TokenText = Callable[[int], str]  # a token's own text


@dataclass(frozen=True, slots=True)
class Kind:
    """What differs between completions and chat answers."""

    id_prefix: str
    whole: str  # the answer's `object`
    chunk: str  # each event's `object`
    chat: bool


COMPLETION = Kind("cmpl-", "text_completion", "text_completion", chat=False)
CHAT = Kind("chatcmpl-", "chat.completion", "chat.completion.chunk", chat=True)


@dataclass(frozen=True, slots=True)
class Header:
    """The fields every answer and event of one request shares."""

    kind: Kind
    id: str
    created: int
    model: str

    @classmethod
    def new(cls, kind: Kind, model: str) -> Header:
        return cls(kind, kind.id_prefix + os.urandom(12).hex(), int(time.time()), model)

    def fields(self, chunk: bool) -> dict[str, Any]:
        kind = self.kind
        return {
            "id": self.id,
            "object": kind.chunk if chunk else kind.whole,
            "created": self.created,
            "model": self.model,
        }


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI's usage: `cached_tokens` are the prompt tokens the prefix cache held."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def logprobs(
    kind: Kind, entries: Sequence[TokenLogprob], token_text: TokenText, offset: int = 0
) -> dict[str, Any] | None:
    """OpenAI's `logprobs` of a choice (or of an event's part of it): chat's `content` list, or
    completions' parallel lists (`text_offset` from `offset`, the characters sent before)."""
    if not entries:
        return None
    if kind.chat:
        return {"content": [_chat_logprob(entry, token_text) for entry in entries]}
    tokens = [token_text(entry.token) for entry in entries]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [{token_text(t): value for t, value in entry.top} for entry in entries],
        "text_offset": offsets,
    }


def _chat_logprob(entry: TokenLogprob, token_text: TokenText) -> dict[str, Any]:
    def one(token: int, value: float) -> dict[str, Any]:
        text = token_text(token)
        return {"token": text, "logprob": value, "bytes": list(text.encode())}

    return one(entry.token, entry.logprob) | {"top_logprobs": [one(t, value) for t, value in entry.top]}


def whole(
    header: Header,
    completions: Sequence[Completion],
    prompt_tokens: int,
    token_text: TokenText,
    choices_per_prompt: int = 1,
) -> dict[str, Any]:
    """The answer to a request that did not stream: one choice per completion, in order
    (prompt by prompt, then n by n); `prompt_tokens` counts each prompt once, and so do the
    cached tokens (its first choice's)."""
    choices = []
    for index, completion in enumerate(completions):
        choice: dict[str, Any] = {"index": index}
        if header.kind.chat:
            choice["message"] = {"role": "assistant", "content": completion.text}
        else:
            choice["text"] = completion.text
        choice |= {
            "logprobs": logprobs(header.kind, completion.logprobs, token_text),
            "finish_reason": completion.finish_reason,
        }
        choices.append(choice)
    generated = sum(completion.generated_tokens for completion in completions)
    cached = sum(completion.cached_tokens for completion in completions[::choices_per_prompt])
    return header.fields(chunk=False) | {"choices": choices, "usage": usage(prompt_tokens, generated, cached)}


def event(
    header: Header,
    index: int,
    text: str,
    finish_reason: str | None,
    first: bool,
    with_usage: bool,
    token_logprobs: dict[str, Any] | None = None,
) -> bytes:
    """One event of choice `index`: its new text (`first`: the chat's role goes with it)."""
    choice: dict[str, Any] = {"index": index}
    if header.kind.chat:
        choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
    else:
        choice["text"] = text
    choice |= {"logprobs": token_logprobs, "finish_reason": finish_reason}
    body = header.fields(chunk=True) | {"choices": [choice]}
    if with_usage:
        body["usage"] = None
    return b"data: " + orjson.dumps(body) + b"\n\n"


def usage_event(header: Header, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> bytes:
    body = header.fields(chunk=True) | {
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens, cached_tokens),
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


def error_event(error: BaseException) -> bytes:
    """An error after the first event (its status line is gone): OpenAI's error body, then the end."""
    return b"data: " + orjson.dumps(openai_error_body(error)) + b"\n\n" + DONE
