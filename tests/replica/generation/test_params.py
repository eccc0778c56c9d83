"""A generation request's parameters: every bad one is a 400 that names the field and the value."""

from __future__ import annotations

from typing import Any

import pytest

from batchd.api.spec import GenerationSpec
from batchd.replica.errors import InvalidInput
from batchd.replica.generation.params import (
    GenerationLimits,
    GenerationParams,
    check_prompt,
    defaults_from,
    parse_parameters,
)

LIMITS = GenerationLimits.of(GenerationSpec(max_new_tokens=64, max_prompt_tokens=100), context_tokens=128)
DEFAULTS = GenerationParams(max_new_tokens=16)


def parse(raw: Any) -> GenerationParams:
    return parse_parameters(raw, LIMITS, DEFAULTS)


def test_what_a_request_asks_for_is_read_over_the_defaults() -> None:
    assert parse(None) == DEFAULTS
    assert parse(
        {"max_tokens": 8, "temperature": 0.5, "top_p": 0.9, "top_k": 5, "seed": 3, "stop": "\n"}
    ) == (GenerationParams(max_new_tokens=8, temperature=0.5, top_p=0.9, top_k=5, seed=3, stop=("\n",)))
    assert parse({"max_new_tokens": 64, "min_new_tokens": 64}).min_new_tokens == 64
    assert parse({"do_sample": True}).temperature == 1.0
    assert parse({"do_sample": False, "temperature": 1.5}).greedy
    assert parse({"temperature": 0}).greedy


@pytest.mark.parametrize(
    ("raw", "field", "value"),
    [
        ({"max_tokens": 65}, "parameters.max_tokens", "65"),
        ({"max_new_tokens": 0}, "parameters.max_new_tokens", "0"),
        ({"max_new_tokens": True}, "parameters.max_new_tokens", "True"),
        ({"max_tokens": 4, "max_new_tokens": 4}, "parameters.max_tokens", "not both"),
        ({"min_new_tokens": 20}, "parameters.min_new_tokens", "20"),
        ({"temperature": 2.5}, "parameters.temperature", "2.5"),
        ({"temperature": "hot"}, "parameters.temperature", "'hot'"),
        ({"temperature": 0, "do_sample": True}, "parameters.temperature", "do_sample"),
        ({"top_p": 0}, "parameters.top_p", "0"),
        ({"top_k": -1}, "parameters.top_k", "-1"),
        ({"seed": -3}, "parameters.seed", "-3"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "parameters.stop", "5 stop strings"),
        ({"stop": [""]}, "parameters.stop[0]", "''"),
        ({"stop": 3}, "parameters.stop", "3"),
        ({"beams": 4}, "parameters.beams", "unknown"),
        ([1], "parameters", "[1]"),
    ],
)
def test_a_bad_parameter_is_refused_naming_the_field_and_the_value(raw: Any, field: str, value: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse(raw)
    assert str(refused.value).startswith(f"{field}:") and value in str(refused.value)


def test_a_prompt_must_fit_the_limits_and_the_context() -> None:
    check_prompt(64, GenerationParams(max_new_tokens=64), LIMITS, "text_input")
    with pytest.raises(
        InvalidInput, match=r"^text_input: 101 tokens, more than model.generation.max_prompt_tokens"
    ):
        check_prompt(101, DEFAULTS, LIMITS, "text_input")
    with pytest.raises(
        InvalidInput, match=r"^text_input: 90 prompt tokens and max_new_tokens=64 exceed .* 128"
    ):
        check_prompt(90, GenerationParams(max_new_tokens=64), LIMITS, "text_input")


class _Config:
    do_sample = None
    temperature = None
    top_k = None
    top_p = None


def test_defaults_are_the_pipelines_under_call_kwargs() -> None:
    pipeline_like = defaults_from({}, LIMITS, _Config())
    assert pipeline_like == GenerationParams(max_new_tokens=32, temperature=0.7, top_k=50)
    greedy = defaults_from({"do_sample": False, "max_new_tokens": 8, "num_beams": 2}, LIMITS, _Config())
    assert greedy.greedy and greedy.max_new_tokens == 8
    with pytest.raises(InvalidInput, match=r"^model.call_kwargs.max_new_tokens: 100 is more"):
        defaults_from({"max_new_tokens": 100}, LIMITS, _Config())
