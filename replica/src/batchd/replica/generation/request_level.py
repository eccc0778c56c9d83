"""Request-level batching of generation requests (`model.generation.scheduling: request`).

The batcher gathers requests into a batch and transformers' `generate` runs it as one padded
batch until its longest answer is done: the way batchd served text generation before token-level
scheduling, kept for comparison and for models the token-level scheduler cannot drive.

Each request still gets what it asked for. `generate` takes one configuration per call, so a
logits processor (`RowChoices`) picks each row's token by the row's own parameters (`sampling`,
the same rules as the engine), hands `generate` a score of 0 for that token and -inf for every
other, and `generate` runs greedily; a row past its own max_new_tokens is given the
end-of-sequence token (it computes on as padding until the batch is done). The answers are then
cut where each request ends and turned into text by the same `TextStream` as the engine's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from batchd.api.spec import BatchingSpec, ModelSpec
from batchd.replica.batching import Batcher
from batchd.replica.generation.generator import GenerationSetup
from batchd.replica.generation.model_limits import limits_and_defaults, model_eos_ids
from batchd.replica.generation.params import (
    Chunk,
    Completion,
    GenerationParams,
    GenerationRequest,
)
from batchd.replica.generation.preparing import Preparer
from batchd.replica.generation.sampling import generator_for, next_tokens
from batchd.replica.generation.streams import Deliver, SequenceObserver, SequenceStream
from batchd.replica.generation.text import Decoder, TextStream
from batchd.replica.models.executor import ModelExecutor
from batchd.replica.models.pipelines import PipelineModel, open_pipeline
from batchd.replica.waiting import NO_CLIENT, Client


@dataclass
class _Row:
    params: GenerationParams
    generator: torch.Generator | None
    generated: int = 0


@dataclass
class RowChoices:
    """A transformers logits processor: each row's next token, chosen by that row's parameters."""

    rows: list[_Row]
    eos_ids: tuple[int, ...]
    prompt_length: int  # of the padded batch: what `input_ids` is long before the first new token

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        made = input_ids.shape[1] - self.prompt_length
        for row in self.rows:
            row.generated = made
        tokens = next_tokens(scores, self.rows, self.eos_ids)
        for index, row in enumerate(self.rows):
            if made >= row.params.max_new_tokens and self.eos_ids:
                tokens[index] = self.eos_ids[0]  # this request is done: padding until the batch is
        chosen = torch.full_like(scores, float("-inf"))
        chosen[torch.arange(len(tokens)), torch.tensor(tokens, device=scores.device)] = 0.0
        return chosen


def generate_batch(
    model: Any,
    decoder: Decoder,
    requests: Sequence[GenerationRequest],
    *,
    eos_ids: tuple[int, ...],
    special_ids: frozenset[int],
    pad_id: int,
) -> list[Completion]:
    """One `generate` call for the whole batch; each request's answer, cut where it ends."""
    from transformers import GenerationConfig, LogitsProcessorList

    lengths = [len(request.prompt_ids) for request in requests]
    padded = max(lengths)
    ids = torch.full((len(requests), padded), pad_id, dtype=torch.long)
    attention = torch.zeros((len(requests), padded), dtype=torch.long)
    for index, request in enumerate(requests):
        ids[index, padded - lengths[index] :] = torch.tensor(request.prompt_ids)
        attention[index, padded - lengths[index] :] = 1
    rows = [_Row(r.params, generator_for(r.params, model.device)) for r in requests]
    config = GenerationConfig(  # type: ignore[no-untyped-call]
        max_new_tokens=max(r.params.max_new_tokens for r in requests),
        do_sample=False,
        num_beams=1,
        repetition_penalty=1.0,
        pad_token_id=pad_id,
        eos_token_id=list(eos_ids) or None,
    )
    with torch.inference_mode():
        output = model.generate(
            input_ids=ids.to(model.device),
            attention_mask=attention.to(model.device),
            generation_config=config,
            logits_processor=LogitsProcessorList([RowChoices(rows, eos_ids, padded)]),
        )
    return [
        _completion(decoder, request, output[index, padded:].tolist(), eos_ids, special_ids)
        for index, request in enumerate(requests)
    ]


def _completion(
    decoder: Decoder,
    request: GenerationRequest,
    tokens: list[int],
    eos_ids: tuple[int, ...],
    special_ids: frozenset[int],
) -> Completion:
    text = TextStream(decoder, request.prompt_ids, request.params.stop, special_ids)
    made: list[int] = []
    finish = "length"
    for token in tokens[: request.params.max_new_tokens]:
        made.append(token)
        text.push(token)
        if token in eos_ids or text.stopped:
            finish = "stop"
            break
    text.flush()
    return Completion(text.text, finish, len(request.prompt_ids), tuple(made))


class RequestLevel:
    """The generation service over the batcher: a request's answer comes whole, with its batch."""

    scheduling: Literal["request"] = "request"

    def __init__(
        self, batcher: Batcher, preparer: Preparer, observer: SequenceObserver | None = None
    ) -> None:
        self.batcher = batcher
        self.preparer = preparer
        self._observer = observer

    @property
    def waiting(self) -> int:
        return self.batcher.queue_depth

    @property
    def running(self) -> int:
        return self.batcher.running_items

    @property
    def longest_step_s(self) -> float:
        return 0.0  # a batch in the model is the batcher's to watch

    @property
    def kv_usage(self) -> float:
        return 0.0  # no cache outlives its batch

    @property
    def sheddable(self) -> int:
        return 0  # the batcher's items, counted there

    def class_depths(self) -> list[tuple[str, int]]:
        return []  # likewise

    @property
    def prefix_cache(self) -> None:
        return None  # transformers' generate computes every prompt whole

    def open(self, request: GenerationRequest, client: Client = NO_CLIENT) -> SequenceStream:
        """A stream of one chunk: the whole answer, when its batch is done."""
        loop = asyncio.get_running_loop()

        def start(deliver: Deliver) -> Callable[[], None]:
            task = loop.create_task(self.batcher.infer([request]), name="batchd-generation-request")

            def done(task: asyncio.Task[list[Any]]) -> None:
                if task.cancelled():
                    return
                error = task.exception()
                if error is not None:
                    deliver(error)
                    return
                (completion,) = task.result()
                deliver(Chunk(completion.text, completion.token_ids, completion.finish_reason))

            task.add_done_callback(done)

            def cancel() -> None:
                task.cancel()

            return cancel

        timeout_s = self.batcher.config.request_timeout_s
        return SequenceStream(start, request, timeout_s, client, self._observer)

    async def complete(
        self, requests: Sequence[GenerationRequest], client: Client = NO_CLIENT
    ) -> list[Completion]:
        started = time.perf_counter()
        completions: list[Completion] = await self.batcher.infer(requests, client)
        trace = client.trace
        exemplar = None if trace is None else trace.exemplar
        for request, completion in zip(requests, completions, strict=True):
            seconds = time.perf_counter() - started  # the whole answer comes at once
            if self._observer is not None:
                self._observer.first_token(seconds, exemplar)
                self._observer.sequence_done(completion.prompt_tokens, completion.generated_tokens, None)
            if trace is not None:
                trace.first_token(seconds)
                trace.tokens(completion.prompt_tokens, completion.generated_tokens)
                if trace.captures_text:
                    trace.prompt_text(request.prompt, completion.text, completion.finish_reason)
        return completions

    def reconfigure(self, config: BatchingSpec) -> None:
        pass  # the batcher is retuned by the replica

    def begin_draining(self) -> None:
        pass

    async def drain(self) -> None:
        pass  # the batcher drains with the replica


def load_request_level(
    spec: ModelSpec, location: str, device: str, dtype: Any, executor: ModelExecutor
) -> RequestLevelModel:
    """The request-level text-generation model: the pipeline for plain prompts (V1, V2, `/?text=`),
    `generate_batch` for generation requests, both under the pipeline's lock, in one batch."""
    task = open_pipeline(spec, location, device, dtype)
    pipe, run_texts, lock = task.pipe, task.run, task.lock
    tokenizer = pipe.tokenizer
    model = pipe.model
    limits, defaults = limits_and_defaults(spec, model, tokenizer)
    eos_ids = model_eos_ids(model, tokenizer)
    special = frozenset(int(i) for i in tokenizer.all_special_ids)
    pad_id = int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else 0
    # A second tokenizer for the event loop's checks: the batch thread decodes with the pipeline's.
    from transformers import AutoTokenizer

    template = spec.generation_spec.chat_template
    preparer = Preparer(AutoTokenizer.from_pretrained(location), limits, defaults, template)

    def run(items: list[Any]) -> list[Any]:
        plain = [i for i, item in enumerate(items) if not isinstance(item, GenerationRequest)]
        asked = [i for i, item in enumerate(items) if isinstance(item, GenerationRequest)]
        results: list[Any] = [None] * len(items)
        if plain:
            for i, result in zip(plain, run_texts([items[i] for i in plain]), strict=True):
                results[i] = result
        if asked:
            with lock:
                answers = generate_batch(
                    model,
                    tokenizer,
                    [items[i] for i in asked],
                    eos_ids=eos_ids,
                    special_ids=special,
                    pad_id=pad_id,
                )
            for i, answer in zip(asked, answers, strict=True):
                results[i] = answer
        return results

    return RequestLevelModel(
        run, executor, task.metadata, task.item_adapter, task.warmup_text, preparer=preparer
    )


class RequestLevelModel(PipelineModel):
    """A PipelineModel whose batches may hold generation requests, and that serves them."""

    def __init__(self, *args: Any, preparer: Preparer) -> None:
        super().__init__(*args)
        self.preparer = preparer
        self._service: RequestLevel | None = None

    def generation_service(self, setup: GenerationSetup) -> RequestLevel:
        """Serve through the replica's batcher (which `setup.config` already tunes); there are no steps."""
        if self._service is None:
            self._service = RequestLevel(setup.batcher, self.preparer, setup.sequences)
        return self._service
