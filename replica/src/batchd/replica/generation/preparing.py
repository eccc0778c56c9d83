"""A prompt made ready for the engine: parameters read over the model's defaults, the chat
template applied, the prompt tokenized and checked to fit (InvalidInput naming the field)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from batchd.replica.errors import InvalidInput
from batchd.replica.generation.params import (
    GenerationLimits,
    GenerationParams,
    GenerationRequest,
    check_prompt,
    parse_parameters,
)


class Encoder(Protocol):
    """A tokenizer, as far as turning text (or a chat) into tokens goes."""

    def __call__(self, text: str, **kwargs: Any) -> Any: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def decode(self, token_ids: Any, skip_special_tokens: bool = ...) -> Any: ...

    @property
    def chat_template(self) -> Any: ...

    def __len__(self) -> int: ...


class Preparer:
    """A request's text and parameters, checked and tokenized: what the engine or the batcher runs."""

    def __init__(
        self,
        encoder: Encoder,
        limits: GenerationLimits,
        defaults: GenerationParams,
        chat_template: str | None = None,
    ) -> None:
        self._encoder = encoder
        self.limits = limits
        self.defaults = defaults
        self._chat_template = chat_template  # model.generation.chat_template, over the tokenizer's

    def prepare(self, text: Any, parameters: Any, field: str) -> GenerationRequest:
        return self.prepare_with(text, parse_parameters(parameters, self.limits, self.defaults), field)

    def prepare_with(self, text: Any, params: GenerationParams, field: str) -> GenerationRequest:
        """A prompt with parameters already read (`parse_parameters`)."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput(f"{field}: expected a non-empty string, got {text!r:.60}")
        prompt_ids = tuple(int(token) for token in self._encoder(text)["input_ids"])
        check_prompt(len(prompt_ids), params, self.limits, field)
        return GenerationRequest(text, prompt_ids, params)

    def encode(self, text: str) -> tuple[int, ...]:
        """The tokens of `text`, unchecked (the replica's own prompts: warm-up, checks)."""
        return tuple(int(token) for token in self._encoder(text)["input_ids"])

    def prepare_ids(
        self, prompt_ids: Sequence[int], params: GenerationParams, field: str
    ) -> GenerationRequest:
        """A prompt given as token ids (each already checked to be an integer)."""
        size = len(self._encoder)
        for index, token in enumerate(prompt_ids):
            if not 0 <= token < size:
                raise InvalidInput(
                    f"{field}[{index}]: token id {token} is not in the vocabulary (0 to {size - 1})"
                )
        check_prompt(len(prompt_ids), params, self.limits, field)
        text = str(self._encoder.decode(list(prompt_ids), skip_special_tokens=False))
        return GenerationRequest(text, tuple(prompt_ids), params)

    def token_text(self, token: int) -> str:
        """One token's text on its own (a piece of a character where it holds only part of one)."""
        return str(self._encoder.decode([token], skip_special_tokens=False))

    def prepare_chat(
        self, messages: list[dict[str, str]], params: GenerationParams, field: str
    ) -> GenerationRequest:
        """The conversation as the model's chat template writes it, ready for the assistant's turn.
        InvalidInput naming `field` when the model has no template (and the spec names none)."""
        template = self._chat_template
        if template is None and not self._encoder.chat_template:
            raise InvalidInput(
                f"{field}: this model has no chat template; send a prompt to /v1/completions, or set "
                "model.generation.chat_template"
            )
        try:
            prompt = str(
                self._encoder.apply_chat_template(
                    messages, chat_template=template, tokenize=False, add_generation_prompt=True
                )
            )
        except Exception as error:  # the template's own checks (roles, order) raise
            raise InvalidInput(f"{field}: the chat template refused the conversation: {error}") from None
        # The template writes the special tokens (a BOS) itself: the tokenizer must not add them again.
        prompt_ids = tuple(
            int(token) for token in self._encoder(prompt, add_special_tokens=False)["input_ids"]
        )
        check_prompt(len(prompt_ids), params, self.limits, field)
        return GenerationRequest(prompt, prompt_ids, params)
