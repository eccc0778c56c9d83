"""Loading a text-generation model, and, for token-level scheduling, checking the scheduler can drive it.

`load_text_generation` loads what `model.generation.scheduling` asks for: the engine (token-level,
here) or the pipeline with the batcher (`request_level`).

The engine runs the model's own forward pass with its own cache, a 4-D attention mask and
explicit position ids: what decoder-only transformers models (GPT-2, Llama, Mistral, Qwen ...)
accept with `sdpa` attention. Before the replica turns ready, the engine generates a few greedy
tokens for a warm-up prompt and compares their ids with `model.generate`'s: a model whose forward
pass does not work that way is refused at load, naming the field that switches to request-level
batching, rather than served wrong. It then checks the same for a prompt whose first blocks come
from the prefix cache; a model that differs there is served without the cache (and says so).
Token ids, not text: the engine decodes its first new token in the prompt's context, so its text
may keep a leading space (WordPiece, SentencePiece) or wait for the rest of a character that
decoding the new tokens alone would not.

The prefix cache is sized once the model is loaded and warm (`model.generation.prefix_cache_bytes`,
by default from what the pod's memory request leaves: `prefix_cache.default_capacity_bytes`).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pydantic import TypeAdapter

from batchd.api.spec import GenerationSpec, ModelSpec, TensorSpec
from batchd.replica.generation.engine import GenerationEngine
from batchd.replica.generation.generator import GenerationSetup, TextGenerator
from batchd.replica.generation.model_limits import limits_and_defaults, model_eos_ids
from batchd.replica.generation.params import GenerationParams, GenerationRequest
from batchd.replica.generation.prefix_cache import BLOCK_TOKENS, default_capacity_bytes
from batchd.replica.generation.preparing import Preparer
from batchd.replica.generation.request_level import load_request_level
from batchd.replica.generation.text import TextStream
from batchd.replica.generation.token_level import TokenLevel
from batchd.replica.models.base import ModelLoadError, ModelMetadata
from batchd.replica.models.executor import ModelExecutor
from batchd.replica.models.pipelines import TEXT, placement, source_errors

logger = logging.getLogger(__name__)

WARMUP_PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Batching amortises the cost of a forward pass over many requests, token by token.",
)
CHECK_TOKENS = 4  # greedy tokens compared with model.generate at load
# While the prefix cache is checked at load: room for the check prompt's blocks, whatever the model.
CHECK_CACHE_BYTES = 64 << 20


class Greedy(NamedTuple):
    """New tokens of one greedy answer, and their text as the engine decodes it (in the prompt's
    context): the ids are compared, the text is for people."""

    token_ids: tuple[int, ...]
    text: str


# transformers' `generate` for a request: the reference the engine's greedy tokens must equal.
Reference = Callable[[GenerationRequest], Greedy]


class TokenGenerationModel:
    """A text-generation model served by the engine: a BatchModel for the rest of the replica
    (metadata, item validation, warm-up), and the token-level `GenerationService` for its routes."""

    def __init__(
        self,
        engine: GenerationEngine,
        preparer: Preparer,
        executor: ModelExecutor,
        item_adapter: TypeAdapter[Any],
        generate_reference: Reference,
        generation: GenerationSpec | None = None,
    ) -> None:
        self.engine = engine
        self.preparer = preparer
        self._executor = executor
        self.item_adapter = item_adapter
        self._reference = generate_reference
        self._generation = generation or GenerationSpec()
        self._prefix_cache_works = True  # until the check at load says otherwise
        self.metadata = ModelMetadata(
            platform="transformers/text-generation",
            inputs=(TensorSpec(name="text", datatype="BYTES"),),
            outputs=(TensorSpec(name="generated_text", datatype="BYTES"),),
        )
        self._service: TokenLevel | None = None

    def generation_service(self, setup: GenerationSetup) -> TokenLevel:
        """Start the engine's thread and serve through it (once the replica is ready to); the
        batcher is not used: sequences have the engine's own queue."""
        if self._service is None:
            self.engine.observer = setup.steps
            self._size_prefix_cache(setup)
            self.engine.tracer = setup.tracer
            self._service = TokenLevel(
                self.engine,
                self.preparer,
                setup.config,
                setup.sequences,
                setup.classes,
                self._generation.prefix_cache_scope,
            )
            self.engine.start(asyncio.get_running_loop())
        return self._service

    def _size_prefix_cache(self, setup: GenerationSetup) -> None:
        """The prefix cache's bound, now that the model is loaded and warm; empty (the warm-up's
        prompts are nobody's)."""
        cache = self.engine.prefix_cache
        wanted = self._generation.prefix_cache_bytes
        if not self._prefix_cache_works:
            wanted = 0
        elif wanted is None:
            running = setup.config.max_batch_size * self.engine.context_tokens * self.engine.token_bytes
            wanted = default_capacity_bytes(*_memory_budget(self.engine, setup.memory_request_bytes), running)
        cache.set_capacity(wanted)
        cache.clear()
        logger.info("prefix cache: %d bytes (%d bytes a token)", wanted, self.engine.token_bytes)

    async def predict_batch(self, items: list[Any]) -> list[Any]:
        """Whole texts for prompts (the pipeline's answer: prompt and continuation), with the
        default parameters. Once serving, through the engine's thread; before, on the executor."""
        requests = [self.preparer.prepare(item, None, f"items[{i}]") for i, item in enumerate(items)]
        if self._service is not None:
            completions = await self._service.complete(requests)
            return [r.prompt + c.text for r, c in zip(requests, completions, strict=True)]
        chunks = await self._executor.run_sync(self.engine.run_to_completion, requests)
        return [r.prompt + "".join(c.text for c in cs) for r, cs in zip(requests, chunks, strict=True)]

    async def warmup(self, max_batch_size: int) -> None:
        await self._executor.run_sync(self._check_and_warm, max(1, min(max_batch_size, 8)))

    def close(self) -> None:
        self.engine.stop()
        self._executor.close()

    def _check_and_warm(self, sequences: int) -> None:
        """The engine's greedy tokens must be generate's (else refuse); then warm every path."""
        params = GenerationParams(max_new_tokens=CHECK_TOKENS, min_new_tokens=CHECK_TOKENS)
        request = self.preparer.prepare(WARMUP_PROMPTS[0], None, "warm-up")
        request = GenerationRequest(request.prompt, request.prompt_ids, params)
        ours = self._greedy(request)
        expected = self._reference(request)
        if ours.token_ids != expected.token_ids:
            raise ModelLoadError(
                "model.generation.scheduling: token-level scheduling cannot drive this model's forward pass "
                f"({_difference(ours, expected)}); use scheduling: request"
            )
        self._check_prefix_cache(params)
        # Within what the spec allows: a deployment may cap answers below the warm-up's 8 tokens.
        length = {"max_new_tokens": min(8, self.preparer.limits.max_new_tokens)}
        warm = [
            self.preparer.prepare(WARMUP_PROMPTS[i % len(WARMUP_PROMPTS)], length, "warm-up")
            for i in range(sequences)
        ]
        self.engine.run_to_completion(warm)

    def _check_prefix_cache(self, params: GenerationParams) -> None:
        """A prompt twice, the second time from the prefix cache: both must be generate's greedy
        tokens; else the replica serves without the cache (a model whose attention cannot read
        copied keys and values, such as one with a sliding window)."""
        fits = self.preparer.limits.context_tokens - params.max_new_tokens
        ids = self.preparer.encode(" ".join(WARMUP_PROMPTS * 2))[:fits]
        if self._generation.prefix_cache_bytes == 0 or len(ids) <= BLOCK_TOKENS:
            return
        request = GenerationRequest("", ids, params)
        expected = self._reference(request)
        cache = self.engine.prefix_cache
        cache.set_capacity(CHECK_CACHE_BYTES)
        try:
            first, cached = self._greedy(request), self._greedy(request)
            hit = cache.stats.hit_tokens
        finally:
            cache.set_capacity(0)
        wrong = next((answer for answer in (cached, first) if answer.token_ids != expected.token_ids), None)
        if wrong is not None or not hit:
            why = "nothing was found cached" if wrong is None else _difference(wrong, expected)
            logger.warning(
                "the prefix cache is off: this model's greedy tokens with the cache (%d tokens cached) "
                "are not transformers' generate's (%s)",
                hit,
                why,
            )
            self._prefix_cache_works = False

    def _greedy(self, request: GenerationRequest) -> Greedy:
        """The engine's answer to `request`, run here (not on the engine's thread)."""
        (chunks,) = self.engine.run_to_completion([request])
        ids = tuple(token for chunk in chunks for token in chunk.token_ids)
        return Greedy(ids, "".join(chunk.text for chunk in chunks))


def _difference(ours: Greedy, expected: Greedy) -> str:
    """Where the engine's greedy tokens first part from generate's, for a message."""
    position = next(
        (i for i, (a, b) in enumerate(zip(ours.token_ids, expected.token_ids, strict=False)) if a != b),
        min(len(ours.token_ids), len(expected.token_ids)),
    )

    def token(ids: Sequence[int]) -> str:
        return f"id {ids[position]}" if position < len(ids) else "none (the answer ended)"

    ids = f"greedy {token(ours.token_ids)}, transformers' generate {token(expected.token_ids)}"
    return f"new token {position + 1}: {ids}; greedy {ours.text!r}, transformers' generate {expected.text!r}"


def load_text_generation(spec: ModelSpec, location: str, executor: ModelExecutor) -> TextGenerator:
    """The model for `spec.task: text-generation`, scheduled as `model.generation.scheduling` says."""
    device, dtype = placement(spec, location)
    with source_errors(spec, location):
        if spec.generation_spec.scheduling == "token":
            return load_token_level(spec, location, device, dtype, executor, TEXT)
        return load_request_level(spec, location, device, dtype, executor)


def load_token_level(
    spec: ModelSpec,
    location: str,
    device: str,
    dtype: Any,
    executor: ModelExecutor,
    item_adapter: TypeAdapter[Any],
) -> TokenGenerationModel:
    """The tokenizers, the model and the engine for `spec` at `location`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    # The event loop tokenizes prompts and the engine's thread decodes tokens: Rust tokenizers
    # refuse to be used by two threads at once, so each has its own.
    encoder = AutoTokenizer.from_pretrained(location)
    decoder = AutoTokenizer.from_pretrained(location)
    model: Any = AutoModelForCausalLM.from_pretrained(location, dtype=dtype, attn_implementation="sdpa")
    model = model.to(device).eval()
    limits, defaults = limits_and_defaults(spec, model, encoder)
    context = limits.context_tokens
    eos_ids = model_eos_ids(model, encoder)
    pad_id = encoder.pad_token_id if encoder.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
    special = frozenset(int(i) for i in encoder.all_special_ids)
    engine = GenerationEngine(
        model,
        decoder,
        eos_ids=eos_ids,
        special_ids=special,
        pad_id=pad_id,
        context_tokens=context,
        max_running=1,
    )
    preparer = Preparer(encoder, limits, defaults, spec.generation_spec.chat_template)

    # The check compares forward passes, so its reference is plain greedy decoding: none of the
    # defaults a model ships for `generate` (a repetition penalty, banned n-grams), which the engine
    # does not apply either; answers end where the engine's end. `generate` fills what a config
    # passed to it leaves unset from the model's own, so the model's own is replaced (nothing else
    # of token-level generation reads it).
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=False, pad_token_id=pad_id, eos_token_id=list(eos_ids) or None
    )

    def reference(request: GenerationRequest) -> Greedy:
        with torch.inference_mode():
            ids = torch.tensor([request.prompt_ids], device=model.device)
            output = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=request.params.max_new_tokens,
                min_new_tokens=request.params.min_new_tokens,
            )
        new = tuple(int(token) for token in output[0, ids.shape[1] :].tolist())
        text = TextStream(decoder, request.prompt_ids, (), special)
        return Greedy(new, "".join(text.push(token) for token in new) + text.flush())

    logger.info("token-level generation: context %d tokens, defaults %s", context, defaults)
    return TokenGenerationModel(engine, preparer, executor, item_adapter, reference, spec.generation_spec)


def _memory_budget(engine: GenerationEngine, memory_request_bytes: int | None) -> tuple[int | None, int]:
    """What the prefix cache may share, and what is used of it already: on a GPU, the device's
    free memory (nothing of it used); else the pod's memory request and the process's resident
    memory at its peak so far (the model loaded and warm)."""
    import torch

    device = engine.device
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, 0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return memory_request_bytes, peak_kib * 1024
