"""What a loaded text-generation model allows a request: its context, its defaults, its end tokens.

Read once at load, from the model's config and generation config and the spec, by both the
token-level and the request-level path; a bad default is a ModelLoadError naming the field.
"""

from __future__ import annotations

from typing import Any

from batchd.api.spec import ModelSpec
from batchd.replica.errors import InvalidInput
from batchd.replica.generation.params import GenerationLimits, GenerationParams, defaults_from
from batchd.replica.models.base import ModelLoadError


def limits_and_defaults(
    spec: ModelSpec, model: Any, tokenizer: Any
) -> tuple[GenerationLimits, GenerationParams]:
    """What the spec and the model allow a request, and what one that asks for nothing gets."""
    limits = GenerationLimits.of(spec.generation_spec, context_tokens(model.config, tokenizer))
    try:
        return limits, defaults_from(spec.call_kwargs, limits, model.generation_config)
    except InvalidInput as error:
        raise ModelLoadError(str(error)) from None


def context_tokens(config: Any, tokenizer: Any) -> int:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    length = getattr(tokenizer, "model_max_length", None)
    if isinstance(length, int) and 0 < length < 1_000_000:
        return length
    raise ModelLoadError(
        "model.source: the model's config states no context length (max_position_embeddings)"
    )


def model_eos_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return ()
    return tuple(int(i) for i in (eos if isinstance(eos, list) else [eos]))
