"""The OpenAI protocol's pure parts: requests read (every unsupported field refused by name),
answers and events written, errors in OpenAI's shape, and its routes beside KServe V1's."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from batchd.api.routes import KSERVE_V1_PREDICT, OPENAI_COMPLETIONS, RouteTable
from batchd.replica.errors import InvalidInput, QueueFull, TooLarge, http_error, openai_error_body
from batchd.replica.front.protocols.openai import answers
from batchd.replica.front.protocols.openai.completions import choices_of
from batchd.replica.front.protocols.openai.requests import read_chat, read_completion, read_embedding
from batchd.replica.generation.params import (
    Completion,
    GenerationLimits,
    GenerationParams,
    GenerationRequest,
    TokenLogprob,
)
from batchd.replica.generation.preparing import Preparer


def refused(read: Any, body: dict[str, Any]) -> InvalidInput:
    with pytest.raises(InvalidInput) as error:
        read(body)
    return error.value


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("logit_bias", {"50256": -100}),
        ("presence_penalty", 1.0),
        ("frequency_penalty", -0.5),
        ("echo", True),
        ("suffix", "end"),
        ("response_format", {"type": "json_object"}),
        ("top_k", 5),  # not OpenAI's
    ],
)
def test_a_field_that_asks_for_what_batchd_does_not_do_is_refused_by_name(field: str, value: Any) -> None:
    error = refused(read_completion, {"model": "m", "prompt": "hi", field: value})
    assert error.param == field and str(error).startswith(f"{field}: ")


def test_absent_null_and_neutral_fields_ask_for_nothing() -> None:
    ask = read_completion(
        {
            "model": "m",
            "prompt": "hi",
            "presence_penalty": 0,
            "frequency_penalty": 0.0,
            "logit_bias": {},
            "echo": False,
            "suffix": None,
            "best_of": 1,
            "user": "someone",
            "temperature": None,
        }
    )
    assert ask.parameters == {} and ask.choices == 1 and not ask.stream


def test_sampling_fields_become_generation_parameters() -> None:
    ask = read_completion(
        {
            "model": "m",
            "prompt": ["a", [1, 2]],
            "max_tokens": 5,
            "temperature": 0.5,
            "top_p": 0.9,
            "seed": 3,
            "stop": "x",
        }
    )
    assert ask.prompts == ("a", (1, 2))
    assert ask.parameters == {"max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "seed": 3, "stop": "x"}
    chat, _ = read_chat(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 7}
    )
    assert chat.parameters == {"max_tokens": 7}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "hi"}, "model"),
        ({"model": "m"}, "prompt"),
        ({"model": "m", "prompt": []}, "prompt"),
        ({"model": "m", "prompt": ["a", {}]}, "prompt[1]"),
        ({"model": "m", "prompt": "hi", "n": 17}, "n"),
        ({"model": "m", "prompt": "hi", "logprobs": 6}, "logprobs"),
        ({"model": "m", "prompt": "hi", "stream": "yes"}, "stream"),
        ({"model": "m", "prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"model": "m", "prompt": "hi", "stream": True, "stream_options": {"x": 1}}, "stream_options.x"),
        ({"model": "m", "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ],
)
def test_malformed_completions_are_refused_naming_the_field(body: dict[str, Any], param: str) -> None:
    assert refused(read_completion, body).param == param


def test_chat_messages_are_text_with_the_roles_templates_know() -> None:
    _, messages = read_chat(
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            ],
        }
    )
    assert messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "ab"}]
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    assert refused(read_chat, {"model": "m", "messages": [image]}).param == "messages[0].content[0]"
    tool = {"role": "tool", "content": "42", "tool_call_id": "1"}
    assert refused(read_chat, {"model": "m", "messages": [tool]}).param == "messages[0].tool_call_id"
    assert (
        refused(read_chat, {"model": "m", "messages": [{"role": "bot", "content": "x"}]}).param
        == "messages[0].role"
    )
    no_logprobs = {"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}
    assert refused(read_chat, no_logprobs).param == "top_logprobs"


def test_embedding_inputs_in_every_form() -> None:
    assert read_embedding({"model": "m", "input": "a"}).inputs == ("a",)
    assert read_embedding({"model": "m", "input": ["a", "b"]}).inputs == ("a", "b")
    assert read_embedding({"model": "m", "input": [1, 2]}).inputs == ((1, 2),)
    assert read_embedding({"model": "m", "input": [[1], [2, 3]], "encoding_format": "base64"}).base64
    assert (
        refused(read_embedding, {"model": "m", "input": "a", "encoding_format": "int8"}).param
        == "encoding_format"
    )
    assert refused(read_embedding, {"model": "m", "input": [[]]}).param == "input[0]"


def test_errors_in_openais_shape_with_the_tables_status() -> None:
    overload = http_error(QueueFull(8, 7, retry_after_s=2.4), openai_error_body)
    assert overload.status == 503 and (b"retry-after", b"2") in overload.headers
    assert overload.body["error"]["type"] == "service_unavailable_error"
    assert overload.body["error"]["code"] == "queue_full" and overload.body["error"]["param"] is None
    bad = openai_error_body(InvalidInput("max_tokens: 5000 is more than this model allows"))
    assert bad["error"] == {
        "message": "max_tokens: 5000 is more than this model allows",
        "type": "invalid_request_error",
        "param": "max_tokens",
        "code": "invalid",
    }
    assert openai_error_body(TooLarge("n: 4 prompt(s) times n=8 ..."))["error"]["param"] == "n"


class _Tokenizer:
    """Enough of a tokenizer: one token per character, no chat template of its own."""

    chat_template = None

    def __call__(self, text: str, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) % 100 for c in text]}

    def apply_chat_template(self, conversation: Any, chat_template: str | None = None, **_: Any) -> str:
        assert chat_template is not None
        return "".join(m["content"] + "|" for m in conversation)

    def decode(self, token_ids: Any, skip_special_tokens: bool = False) -> str:
        return "".join(chr(65 + t % 26) for t in token_ids)

    def __len__(self) -> int:
        return 100


LIMITS = GenerationLimits(max_new_tokens=16, max_prompt_tokens=None, max_stop_strings=4, context_tokens=64)


def test_a_model_without_a_chat_template_refuses_chat_naming_messages() -> None:
    params = GenerationParams(max_new_tokens=4)
    with pytest.raises(InvalidInput, match=r"model\.generation\.chat_template") as error:
        Preparer(_Tokenizer(), LIMITS, params).prepare_chat(
            [{"role": "user", "content": "hi"}], params, "messages"
        )
    assert error.value.param == "messages"
    templated = Preparer(_Tokenizer(), LIMITS, params, chat_template="{{ messages }}")
    assert templated.prepare_chat([{"role": "user", "content": "hi"}], params, "messages").prompt == "hi|"
    with pytest.raises(InvalidInput, match=r"prompt\[1\]: token id 100 is not in the vocabulary"):
        templated.prepare_ids([5, 100], params, "prompt")


def test_n_choices_per_prompt_each_seeded_apart() -> None:
    seeded = GenerationRequest("p", (1,), GenerationParams(temperature=1.0, seed=7))
    plain = GenerationRequest("q", (2,), GenerationParams())
    requests = choices_of([seeded, plain], 2)
    assert [r.prompt for r in requests] == ["p", "p", "q", "q"]
    assert [r.params.seed for r in requests] == [7, 8, None, None]


def test_answers_and_events_are_openais_objects() -> None:
    header = answers.Header(answers.CHAT, "chatcmpl-1", 5, "m")
    completion = Completion(
        "hi", "stop", 3, (7, 8), (TokenLogprob(7, -0.5, ((7, -0.5), (9, -1.5))),), cached_tokens=16
    )
    body = answers.whole(header, [completion], 3, lambda token: f"<{token}>")
    assert body["object"] == "chat.completion" and body["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 16},
    }
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "hi"} and choice["finish_reason"] == "stop"
    assert choice["logprobs"]["content"][0]["top_logprobs"][1] == {
        "token": "<9>",
        "logprob": -1.5,
        "bytes": [60, 57, 62],
    }
    event = answers.event(header, 0, "h", None, first=True, with_usage=True)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    chunk = orjson.loads(event[len(b"data: ") :])
    assert chunk["object"] == "chat.completion.chunk" and chunk["usage"] is None
    assert chunk["choices"][0]["delta"] == {"role": "assistant", "content": "h"}
    texts = answers.logprobs(answers.COMPLETION, completion.logprobs * 2, lambda token: "ab", offset=4)
    assert texts is not None and texts["text_offset"] == [4, 6] and texts["top_logprobs"][0] == {"ab": -1.5}


def test_openai_routes_sit_beside_kserve_v1s() -> None:
    table = RouteTable()
    found = table.match("POST", "/v1/completions")
    assert found is not None and found.route is OPENAI_COMPLETIONS and found.model_name is None
    predict = table.match("POST", "/v1/models/completions:predict")
    assert predict is not None and predict.route is KSERVE_V1_PREDICT and predict.model_name == "completions"
    # The model listing and status are no inference routes: one FastAPI route answers both protocols.
    assert table.match("GET", "/v1/models") is None and table.match("GET", "/v1/models/m") is None
