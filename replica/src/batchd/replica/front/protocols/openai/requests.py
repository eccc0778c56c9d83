"""OpenAI request bodies read into what batchd runs: pure functions, every refusal naming its field.

The rule (as OpenAI's own API answers an unknown parameter): a field batchd does not implement is
refused by name (400, `param` the field), unless it is absent, `null`, or holds the value that
asks for nothing (`presence_penalty: 0`, `echo: false`, `n`-sized `best_of`, ...), which clients
and frameworks send by default. Sampling fields become the generate extension's parameters, read
by `batchd.replica.generation.params` with the limits of the spec (`max_tokens` over
model.generation.max_new_tokens: 400).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batchd.api.priority import PriorityError, named_in_body
from batchd.replica.errors import InvalidInput, TooLarge

# Sampling fields passed on to the generation parameters under the same name.
SAMPLING = ("temperature", "top_p", "seed", "stop")
# Fields that ask for nothing when they hold these values (what SDKs and frameworks send).
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logit_bias": ({},),
    "echo": (False,),
    "suffix": ("",),
    "tools": ([],),
    "functions": ([],),
    "tool_choice": ("none",),
    "parallel_tool_calls": (True, False),  # without tools it says nothing
    "response_format": ({"type": "text"},),
    "store": (False,),
    "stream_options": ({},),
}
COMMON = ("model", "n", "stream", "stream_options", "user", "metadata", "max_tokens", *SAMPLING)
COMPLETION_FIELDS = (*COMMON, "prompt", "logprobs", "best_of")
CHAT_FIELDS = (*COMMON, "messages", "max_completion_tokens", "logprobs", "top_logprobs")
EMBEDDING_FIELDS = ("model", "input", "encoding_format", "dimensions", "user", "metadata")
CHAT_ROLES = ("system", "developer", "user", "assistant")
MAX_CHOICES = 16  # `n`: sequences one request may ask for per prompt
# Most likely alternatives per token at most, as OpenAI bounds them: completions' `logprobs`, chat's
# `top_logprobs`.
MAX_COMPLETION_LOGPROBS = 5
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class GenerationAsk:
    """A completions or chat request, read: its prompts (texts or token ids), the generate
    extension's parameters, and how to answer."""

    model: str
    prompts: tuple[str | tuple[int, ...], ...]
    parameters: dict[str, Any]
    choices: int  # `n`
    stream: bool
    include_usage: bool
    logprobs: int | None = None  # alternatives per token with the chosen tokens' log-probabilities
    length_field: str = "max_tokens"  # the field that gave `parameters["max_tokens"]`, for errors


@dataclass(frozen=True, slots=True)
class EmbeddingAsk:
    model: str
    inputs: tuple[str | tuple[int, ...], ...]
    base64: bool
    dimensions: int | None


def read_completion(body: Any) -> GenerationAsk:
    """`POST /v1/completions`: `prompt` a string, a list of strings, token ids or lists of them."""
    body = _object(body, COMPLETION_FIELDS)
    prompts = _texts_or_tokens(body.get("prompt"), "prompt")
    logprobs = body.get("logprobs")
    if logprobs is not None and (not _is_int(logprobs) or not 0 <= logprobs <= MAX_COMPLETION_LOGPROBS):
        raise InvalidInput(
            f"logprobs: expected an integer from 0 to {MAX_COMPLETION_LOGPROBS}, got {logprobs!r:.60}"
        )
    choices = _choices(body)
    best_of = body.get("best_of")
    if best_of is not None and best_of != choices:
        _refuse("best_of", f"only best_of equal to n ({choices}) is served, got {best_of!r}")
    ask = _generation(body, prompts, choices, length_fields=("max_tokens",))
    return dataclasses.replace(ask, logprobs=None if logprobs is None else int(logprobs))


def read_chat(body: Any) -> tuple[GenerationAsk, list[dict[str, str]]]:
    """`POST /v1/chat/completions`: the ask (its one prompt still to be written by the chat
    template) and the conversation, each message's content as plain text."""
    body = _object(body, CHAT_FIELDS)
    messages = _messages(body.get("messages"))
    wanted = body.get("logprobs", False)
    if not isinstance(wanted, bool):
        raise InvalidInput(f"logprobs: expected true or false, got {wanted!r:.60}")
    top = body.get("top_logprobs")
    if top is not None and (not _is_int(top) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise InvalidInput(f"top_logprobs: expected an integer from 0 to {MAX_TOP_LOGPROBS}, got {top!r:.60}")
    if top is not None and not wanted:
        raise InvalidInput("top_logprobs: only with logprobs: true")
    choices = _choices(body)
    ask = _generation(body, (), choices, length_fields=("max_completion_tokens", "max_tokens"))
    return dataclasses.replace(ask, logprobs=int(top or 0) if wanted else None), messages


def read_embedding(body: Any) -> EmbeddingAsk:
    """`POST /v1/embeddings`: `input` a string, a list of strings, token ids or lists of them."""
    body = _object(body, EMBEDDING_FIELDS)
    inputs = _texts_or_tokens(body.get("input"), "input")
    encoding = body.get("encoding_format")
    if encoding not in (None, "float", "base64"):
        raise InvalidInput(f"encoding_format: expected float or base64, got {encoding!r:.60}")
    dimensions = body.get("dimensions")
    if dimensions is not None and (not _is_int(dimensions) or dimensions < 1):
        raise InvalidInput(f"dimensions: expected a positive integer, got {dimensions!r:.60}")
    return EmbeddingAsk(
        body["model"], inputs, encoding == "base64", None if dimensions is None else int(dimensions)
    )


def who_asks(body: Any) -> tuple[str | None, str | None]:
    """The priority class a request's `metadata` names and its `user` (either None where not
    given): the class and the caller where the batchd-priority and batchd-fairness-id headers
    say nothing (`batchd.api.priority`, as the router reads them). InvalidInput naming the field
    unless they are strings."""
    try:
        return named_in_body(body)
    except PriorityError as error:
        raise InvalidInput(str(error)) from None


def _object(body: Any, known: tuple[str, ...]) -> dict[str, Any]:
    """The body's fields that ask for something; the unknown ones refused by name."""
    if not isinstance(body, dict):
        raise InvalidInput(f"request body: expected a JSON object, got {type(body).__name__}")
    asked = {}
    for key, value in body.items():
        if value is None or (key in NEUTRAL and key not in known and value in NEUTRAL[key]):
            continue
        if key not in known:
            _refuse(key, f"not supported by batchd (value {value!r:.60})")
        asked[key] = value
    model = asked.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidInput(f"model: required, the name of the model (GET /v1/models), got {model!r:.60}")
    return asked


def _refuse(field: str, why: str) -> None:
    raise InvalidInput(f"{field}: {why}")


def _generation(
    body: Mapping[str, Any],
    prompts: tuple[str | tuple[int, ...], ...],
    choices: int,
    length_fields: tuple[str, ...],
) -> GenerationAsk:
    parameters = {key: body[key] for key in SAMPLING if key in body}
    given = [key for key in length_fields if key in body]
    if len(given) > 1:
        raise InvalidInput(f"{given[0]}: give {' or '.join(given)}, not both")
    if given:
        length = body[given[0]]
        if not _is_int(length) or length < 1:
            raise InvalidInput(f"{given[0]}: expected an integer of at least 1, got {length!r:.60}")
        parameters["max_tokens"] = int(length)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidInput(f"stream: expected true or false, got {stream!r:.60}")
    options = body.get("stream_options", {})
    if not isinstance(options, dict):
        raise InvalidInput(f"stream_options: expected an object, got {options!r:.60}")
    for key in options:
        if key != "include_usage":
            _refuse(f"stream_options.{key}", "not supported by batchd; include_usage is")
    include_usage = options.get("include_usage")
    if include_usage is None:  # null is not given
        include_usage = False
    elif not isinstance(include_usage, bool):
        raise InvalidInput(f"stream_options.include_usage: expected true or false, got {include_usage!r:.60}")
    if options and not stream:
        raise InvalidInput("stream_options: only with stream: true")
    who_asks(body)
    length_field = given[0] if given else "max_tokens"
    return GenerationAsk(
        body["model"], prompts, parameters, choices, stream, include_usage, None, length_field
    )


def _choices(body: Mapping[str, Any]) -> int:
    choices = body.get("n", 1)
    if not _is_int(choices) or not 1 <= choices <= MAX_CHOICES:
        raise InvalidInput(f"n: expected an integer from 1 to {MAX_CHOICES}, got {choices!r:.60}")
    return int(choices)


def check_fits(ask: GenerationAsk, sequences: int, max_queued: int) -> None:
    """All of a request's sequences (prompts times n) must fit the queue at once."""
    if sequences > max_queued:
        raise TooLarge(
            f"n: {len(ask.prompts) or 1} prompt(s) times n={ask.choices} is {sequences} sequences, more than "
            f"batching.max_queued_requests={max_queued} ever fit"
        )


def _texts_or_tokens(value: Any, field: str) -> tuple[str | tuple[int, ...], ...]:
    """A string, a list of strings, a list of token ids, or a list of such lists."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not value:
        raise InvalidInput(
            f"{field}: required, a string, a list of strings, token ids or lists of token ids; "
            f"got {value!r:.60}"
        )
    if all(_is_int(item) for item in value):
        return (tuple(int(item) for item in value),)
    items: list[str | tuple[int, ...]] = []
    for index, item in enumerate(value):
        if isinstance(item, str):
            items.append(item)
        elif isinstance(item, list) and item and all(_is_int(token) for token in item):
            items.append(tuple(int(token) for token in item))
        else:
            raise InvalidInput(
                f"{field}[{index}]: expected a string or a non-empty list of token ids, got {item!r:.60}"
            )
    return tuple(items)


def _messages(value: Any) -> list[dict[str, str]]:
    """The conversation, each content as text (text parts joined); other parts refused by name."""
    if not isinstance(value, list) or not value:
        raise InvalidInput(f"messages: required, a non-empty list of messages; got {value!r:.60}")
    messages = []
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise InvalidInput(f"{where}: expected an object with role and content, got {message!r:.60}")
        for key, part in message.items():
            if key not in ("role", "content", "name") and part is not None:
                _refuse(f"{where}.{key}", "not supported by batchd (role, content and name are)")
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise InvalidInput(f"{where}.role: expected one of {', '.join(CHAT_ROLES)}, got {role!r:.60}")
        messages.append(
            {"role": "system" if role == "developer" else role, "content": _content(message, where)}
        )
    return messages


def _content(message: Mapping[str, Any], where: str) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidInput(f"{where}.content: expected a string or a list of text parts, got {content!r:.60}")
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else part
            _refuse(f"{where}.content[{index}]", f"only text parts are served, got {kind!r:.60}")
        texts.append(part["text"])
    return "".join(texts)


def _is_int(value: Any) -> bool:
    """An integer as JSON has it: 3, or 3.0 (JSON has one kind of number, and JSON Schema's
    `integer` takes both)."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)
