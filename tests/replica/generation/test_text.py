"""Text as tokens arrive: what is streamed adds up to what the tokenizer decodes, stop strings cut."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchd.replica.generation.text import TextStream
from batchd.testing.models import build_gpt2


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> object:
    from transformers import AutoTokenizer

    directory: Path = build_gpt2(tmp_path_factory.mktemp("tiny-gpt2"), vocab_size=500)
    return AutoTokenizer.from_pretrained(directory)


def stream(tokenizer: object, text: str, stop: tuple[str, ...] = ()) -> tuple[list[str], TextStream]:
    ids = tokenizer(text)["input_ids"]  # type: ignore[operator]
    prompt, answer = ids[:3], ids[3:]
    text_stream = TextStream(tokenizer, prompt, stop, frozenset({0}))  # type: ignore[arg-type]
    pieces = [text_stream.push(token) for token in answer]
    pieces.append(text_stream.flush())
    return pieces, text_stream


def test_the_pieces_add_up_to_the_decoded_text_even_across_multibyte_characters(tokenizer: object) -> None:
    text = "Once upon a time — a café, naïve, 東京 — the batching server gathered requests."
    pieces, whole = stream(tokenizer, text)
    expected = tokenizer.decode(tokenizer(text)["input_ids"][3:])  # type: ignore[attr-defined,operator]
    assert "".join(pieces) == whole.text == expected
    assert "\ufffd" not in "".join(pieces), "half a character was sent"
    assert sum(1 for piece in pieces if piece) > 5, "the text came in one piece, not as it was made"


def test_a_stop_string_ends_the_text_where_it_begins_and_is_never_sent(tokenizer: object) -> None:
    pieces, whole = stream(
        tokenizer, "Once upon a time there was a batching server that gathered requests.", ("batching",)
    )
    assert whole.stopped and whole.text == " time there was a "
    assert "".join(pieces) == whole.text and "batch" not in "".join(pieces)


def test_special_tokens_add_no_text(tokenizer: object) -> None:
    text_stream = TextStream(tokenizer, [5, 6], (), frozenset({0}))  # type: ignore[arg-type]
    assert text_stream.push(0) == "" and text_stream.flush() == ""
