"""What one generation request asks for, checked against what the spec allows.

Pure functions. A request's `parameters` object (the Open Inference Protocol's generate
extension) is read into `GenerationParams`; anything unknown, of the wrong type or beyond a
limit is an `InvalidInput` (400) that names the field and the value. `model.call_kwargs` gives
the defaults, read by the same function so that a bad default is named the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from batchd.api.spec import DEFAULT_MAX_NEW_TOKENS, GenerationSpec
from batchd.replica.errors import InvalidInput

MAX_TEMPERATURE = 2.0  # as OpenAI and the Open Inference Protocol describe it
# The transformers text-generation pipeline's default (it samples), and transformers' top_k.
PIPELINE_TEMPERATURE = 0.7
DEFAULT_TOP_K = 50
MAX_STOP_CHARS = 256
MAX_SEED = 2**63 - 1
# `max_tokens` is the Open Inference Protocol's name, `max_new_tokens` transformers' and TGI's.
KNOWN = (
    "max_new_tokens",
    "max_tokens",
    "min_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "do_sample",
    "seed",
    "stop",
)


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """How one sequence is generated. `temperature` 0 is greedy decoding (the default)."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int = 0  # the end-of-sequence token is held back until this many were made
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k filter
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # The chosen tokens' log-probabilities, with this many most likely alternatives; None: none.
    logprobs: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True, slots=True)
class GenerationLimits:
    """What the spec and the model allow one request."""

    max_new_tokens: int
    max_prompt_tokens: int | None
    max_stop_strings: int
    context_tokens: int  # the model's context: prompt and new tokens together

    @classmethod
    def of(cls, spec: GenerationSpec, context_tokens: int) -> GenerationLimits:
        return cls(spec.max_new_tokens, spec.max_prompt_tokens, spec.max_stop_strings, context_tokens)


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A prompt, tokenized, and how to continue it: what the scheduler (or the batcher) runs."""

    prompt: str
    prompt_ids: tuple[int, ...]
    params: GenerationParams


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A chosen token's log-probability under the model (its scores before temperature, top-k and
    top-p), and the most likely tokens' at that step (as many as `logprobs` asked for)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class Completion:
    """A whole answer: the new text, why it ended (`length` or `stop`), and the token counts."""

    text: str
    finish_reason: str
    prompt_tokens: int
    token_ids: tuple[int, ...]  # the new tokens (an end-of-sequence token among them)
    logprobs: tuple[TokenLogprob, ...] = ()  # one per new token, where the request asked for them
    cached_tokens: int = 0  # prompt tokens found in the prefix cache, not computed again

    @property
    def generated_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class Chunk:
    """What one step made for one sequence: text to send (often a token's worth, sometimes ''
    while a character or a possible stop string is incomplete), and whether it is now done."""

    text: str
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None  # "length" or "stop" once the sequence has ended; "error"
    error: BaseException | None = None
    logprobs: tuple[TokenLogprob, ...] = ()  # of `token_ids`, where the request asked for them
    cached_tokens: int = 0  # on a sequence's first chunk: prompt tokens copied from the prefix cache

    @property
    def tokens(self) -> int:
        return len(self.token_ids)


def parse_parameters(
    raw: Any, limits: GenerationLimits, defaults: GenerationParams, where: str = "parameters"
) -> GenerationParams:
    """The parameters of one request, over `defaults`; InvalidInput naming `where.field` otherwise
    (`where` empty: the parameters are the request's own fields, named alone)."""
    if raw is None:
        return defaults
    if not isinstance(raw, Mapping):
        raise InvalidInput(f"{where}: expected an object, got {_short(raw)}")
    for key in raw:
        if key not in KNOWN:
            raise InvalidInput(f"{_at(where, key)}: unknown parameter; expected one of {', '.join(KNOWN)}")
    if raw.get("max_tokens") is not None and raw.get("max_new_tokens") is not None:
        raise InvalidInput(f"{_at(where, 'max_tokens')}: give max_tokens or max_new_tokens, not both")
    length_key = "max_tokens" if raw.get("max_tokens") is not None else "max_new_tokens"
    max_new = _integer(raw, length_key, where, defaults.max_new_tokens, low=1)
    if max_new > limits.max_new_tokens:
        raise InvalidInput(
            f"{_at(where, length_key)}: {max_new} is more than this model allows "
            f"(model.generation.max_new_tokens={limits.max_new_tokens})"
        )
    min_new = _integer(raw, "min_new_tokens", where, min(defaults.min_new_tokens, max_new), low=0)
    if min_new > max_new:
        raise InvalidInput(f"{_at(where, 'min_new_tokens')}: {min_new} is more than {length_key}={max_new}")
    temperature = _temperature(raw, where, defaults.temperature)
    top_p = _number(raw, "top_p", where, defaults.top_p)
    if not 0 < top_p <= 1:
        raise InvalidInput(f"{_at(where, 'top_p')}: expected a number in (0, 1], got {top_p!r}")
    top_k = _integer(raw, "top_k", where, defaults.top_k, low=0)
    seed = raw.get("seed", defaults.seed)
    if seed is not None and (not _is_int(seed) or not 0 <= seed <= MAX_SEED):
        raise InvalidInput(f"{_at(where, 'seed')}: expected an integer in [0, 2^63-1], got {_short(seed)}")
    stop = _stop(raw, where, limits, defaults.stop)
    return GenerationParams(
        max_new, min_new, temperature, top_p, top_k, None if seed is None else int(seed), stop
    )


def defaults_from(
    call_kwargs: Mapping[str, Any], limits: GenerationLimits, model_config: Any
) -> GenerationParams:
    """What a request that asks for nothing gets: what the transformers text-generation pipeline
    would do (the model's generation config, else the pipeline's sampling at temperature 0.7 and
    transformers' top_k 50), under `model.call_kwargs` (its other keys are the pipeline's own)."""
    sample = getattr(model_config, "do_sample", None)
    temperature = getattr(model_config, "temperature", None)
    top_k = getattr(model_config, "top_k", None)
    top_p = getattr(model_config, "top_p", None)
    base = GenerationParams(
        max_new_tokens=min(DEFAULT_MAX_NEW_TOKENS, limits.max_new_tokens),
        temperature=0.0
        if sample is False
        else float(PIPELINE_TEMPERATURE if temperature is None else temperature),
        top_k=DEFAULT_TOP_K if top_k is None else int(top_k),
        top_p=1.0 if top_p is None else float(top_p),
    )
    known = {key: value for key, value in call_kwargs.items() if key in KNOWN}
    return parse_parameters(known, limits, base, where="model.call_kwargs")


def check_prompt(prompt_tokens: int, params: GenerationParams, limits: GenerationLimits, field: str) -> None:
    """The prompt must fit: under max_prompt_tokens, and with its new tokens within the context."""
    if prompt_tokens == 0:
        raise InvalidInput(f"{field}: the prompt is empty")
    if limits.max_prompt_tokens is not None and prompt_tokens > limits.max_prompt_tokens:
        raise InvalidInput(
            f"{field}: {prompt_tokens} tokens, more than model.generation.max_prompt_tokens="
            f"{limits.max_prompt_tokens}"
        )
    if prompt_tokens + params.max_new_tokens > limits.context_tokens:
        raise InvalidInput(
            f"{field}: {prompt_tokens} prompt tokens and max_new_tokens={params.max_new_tokens} exceed "
            f"the model's context of {limits.context_tokens} tokens"
        )


def _temperature(raw: Mapping[str, Any], where: str, default: float) -> float:
    """`temperature` 0 is greedy; `do_sample: false` is greedy whatever the temperature; `do_sample:
    true` without a temperature samples at 1, as transformers does."""
    do_sample = raw.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise InvalidInput(f"{_at(where, 'do_sample')}: expected true or false, got {_short(do_sample)}")
    if "temperature" in raw:
        temperature = _number(raw, "temperature", where, default)
        if not 0 <= temperature <= MAX_TEMPERATURE:
            raise InvalidInput(
                f"{_at(where, 'temperature')}: expected a number in [0, {MAX_TEMPERATURE:g}], "
                f"got {temperature!r}"
            )
        if do_sample is True and temperature == 0:
            raise InvalidInput(f"{_at(where, 'temperature')}: 0 means greedy decoding, but do_sample is true")
        return 0.0 if do_sample is False else temperature
    if do_sample is False:
        return 0.0
    if do_sample is True:
        return default or 1.0
    return default


def _stop(
    raw: Mapping[str, Any], where: str, limits: GenerationLimits, default: tuple[str, ...]
) -> tuple[str, ...]:
    if "stop" not in raw:
        return default
    stop = raw["stop"]
    strings = [stop] if isinstance(stop, str) else stop
    if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
        raise InvalidInput(
            f"{_at(where, 'stop')}: expected a string or a list of strings, got {_short(stop)}"
        )
    if len(strings) > limits.max_stop_strings:
        raise InvalidInput(
            f"{_at(where, 'stop')}: {len(strings)} stop strings, more than model.generation.max_stop_strings="
            f"{limits.max_stop_strings}"
        )
    for index, string in enumerate(strings):
        if not 0 < len(string) <= MAX_STOP_CHARS:
            raise InvalidInput(
                f"{_at(where, 'stop')}[{index}]: expected 1 to {MAX_STOP_CHARS} characters, "
                f"got {_short(string)}"
            )
    return tuple(strings)


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _integer(raw: Mapping[str, Any], key: str, where: str, default: int, low: int) -> int:
    value = raw.get(key, default)
    if not _is_int(value) or value < low:
        raise InvalidInput(f"{_at(where, key)}: expected an integer of at least {low}, got {_short(value)}")
    return int(value)


def _number(raw: Mapping[str, Any], key: str, where: str, default: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise InvalidInput(f"{_at(where, key)}: expected a number, got {_short(value)}")
    return float(value)


def _is_int(value: Any) -> bool:
    """An integer as JSON has it: 3, or 3.0 (JSON Schema's `integer` takes both)."""
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, int) and not isinstance(value, bool)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
