"""`POST /v1/completions` and `POST /v1/chat/completions`: thin handlers over the generation service.

Each prompt (a chat's one, written by the chat template) becomes `n` sequences, scheduled like
every generate request (token by token, or by request with `model.generation.scheduling:
request`), admitted all at once or not at all, under the same deadline; a client that leaves
frees its rows at the next step. Choice `i` of a seeded request samples with `seed + i`, so that
the choices differ and each can be reproduced.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Sequence
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from batchd.replica.errors import InvalidInput, UnknownModel
from batchd.replica.front.endpoints import Call, EventStream
from batchd.replica.front.protocols.generate import SSE_HEADERS
from batchd.replica.front.protocols.openai import answers
from batchd.replica.front.protocols.openai.models import check_model
from batchd.replica.front.protocols.openai.requests import (
    GenerationAsk,
    check_fits,
    read_chat,
    read_completion,
    who_asks,
)
from batchd.replica.generation.params import (
    MAX_SEED,
    Chunk,
    GenerationParams,
    GenerationRequest,
    TokenLogprob,
    parse_parameters,
)
from batchd.replica.replica import Replica
from batchd.replica.waiting import Client

if TYPE_CHECKING:  # the generation service imports torch, which only text-generation replicas need
    from batchd.replica.generation.service import GenerationService


async def completions(call: Call) -> dict[str, Any] | EventStream:
    body = call.json()
    ask = read_completion(body)
    call.client = call.client.asking(*who_asks(body))
    service, params = _service(call.replica, ask)
    prepare = service.preparer
    prompts = [
        prepare.prepare_with(prompt, params, f"prompt[{index}]")
        if isinstance(prompt, str)
        else prepare.prepare_ids(prompt, params, f"prompt[{index}]")
        for index, prompt in enumerate(ask.prompts)
    ]
    return await _answer(call, service, ask, prompts, answers.Header.new(answers.COMPLETION, ask.model))


async def chat_completions(call: Call) -> dict[str, Any] | EventStream:
    body = call.json()
    ask, messages = read_chat(body)
    call.client = call.client.asking(*who_asks(body))
    service, params = _service(call.replica, ask)
    prompt = service.preparer.prepare_chat(messages, params, "messages")
    return await _answer(call, service, ask, [prompt], answers.Header.new(answers.CHAT, ask.model))


def _service(replica: Replica, ask: GenerationAsk) -> tuple[GenerationService, GenerationParams]:
    check_model(replica, ask.model)
    if replica.model is not None and replica.generation is None:
        raise UnknownModel(
            f"model: {ask.model!r} does not generate text: /v1/completions and /v1/chat/completions "
            "serve task text-generation"
        )
    service = replica.generator(replica.model_name)
    if ask.logprobs is not None and service.scheduling == "request":
        raise InvalidInput(
            "logprobs: model.generation.scheduling: request gives no log-probabilities; token does"
        )
    preparer = service.preparer
    length, limit = ask.parameters.get("max_tokens"), preparer.limits.max_new_tokens
    if length is not None and length > limit:  # named as the request gave it (chat: either field)
        raise InvalidInput(
            f"{ask.length_field}: {length} is more than this model allows "
            f"(model.generation.max_new_tokens={limit})"
        )
    params = parse_parameters(ask.parameters, preparer.limits, preparer.defaults, where="")
    return service, dataclasses.replace(params, logprobs=ask.logprobs)


def choices_of(prompts: Sequence[GenerationRequest], n: int) -> list[GenerationRequest]:
    """`n` sequences per prompt, prompt by prompt; choice `i` of a seeded prompt samples with seed + i."""
    requests = []
    for prompt in prompts:
        for index in range(n):
            params = prompt.params
            if index and params.seed is not None:
                params = dataclasses.replace(params, seed=(params.seed + index) % (MAX_SEED + 1))
            requests.append(GenerationRequest(prompt.prompt, prompt.prompt_ids, params))
    return requests


async def _answer(
    call: Call,
    service: GenerationService,
    ask: GenerationAsk,
    prompts: Sequence[GenerationRequest],
    header: answers.Header,
) -> dict[str, Any] | EventStream:
    requests = choices_of(prompts, ask.choices)
    check_fits(ask, len(requests), call.replica.batcher.config.max_queued_requests)
    prompt_tokens = sum(len(prompt.prompt_ids) for prompt in prompts)
    if not ask.stream:
        completions = await service.complete(requests, call.client)
        return answers.whole(header, completions, prompt_tokens, service.preparer.token_text, ask.choices)
    events = _events(service, header, requests, ask, prompt_tokens, call.client)
    return EventStream(events, SSE_HEADERS, answers.error_event)


async def _events(
    service: GenerationService,
    header: answers.Header,
    requests: list[GenerationRequest],
    ask: GenerationAsk,
    prompt_tokens: int,
    client: Client,
) -> AsyncGenerator[bytes, None]:
    """The events of a streamed answer: what came for a choice while the client was being written
    to goes in one event (with the log-probabilities of its tokens, and of any held back before)."""
    first = [True] * len(requests)
    sent = [0] * len(requests)  # characters, for completions' text_offset
    held: list[list[TokenLogprob]] = [[] for _ in requests]
    token_text = service.preparer.token_text
    include_usage = ask.include_usage
    generated = cached = 0
    async with AsyncExitStack() as streams:
        opened = [await streams.enter_async_context(service.open(r, client)) for r in requests]
        async for index, pieces in _merged(opened):
            text = "".join(piece.text for piece in pieces)
            finish = pieces[-1].finish_reason
            generated += sum(piece.tokens for piece in pieces)
            if index % ask.choices == 0:  # each prompt's cached tokens once: its first choice's
                cached += sum(piece.cached_tokens for piece in pieces)
            for piece in pieces:
                held[index].extend(piece.logprobs)
            if text or finish:
                scores = answers.logprobs(header.kind, held[index], token_text, sent[index])
                yield answers.event(header, index, text, finish, first[index], include_usage, scores)
                first[index], sent[index], held[index] = False, sent[index] + len(text), []
    if include_usage:
        yield answers.usage_event(header, prompt_tokens, generated, cached)
    yield answers.DONE


async def _merged(streams: Sequence[Any]) -> AsyncGenerator[tuple[int, list[Chunk]], None]:
    """Each stream's chunks as they come, with the stream's index; one stream is read directly."""
    if len(streams) == 1:
        (stream,) = streams
        async for chunk in stream:
            yield 0, [chunk, *stream.ready()]
        return
    queue: asyncio.Queue[tuple[int, Chunk | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: Any) -> None:
        try:
            async for chunk in stream:
                queue.put_nowait((index, chunk))
        except Exception as error:
            queue.put_nowait((index, error))
        queue.put_nowait((index, None))

    tasks = [asyncio.ensure_future(pump(index, stream)) for index, stream in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            index, item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, [item]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
