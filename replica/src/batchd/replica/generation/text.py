"""A sequence's text as its tokens arrive: incremental detokenization and stop strings.

Decoding only the new token is wrong for most tokenizers: byte-level BPE splits one character
over several tokens, and SentencePiece decides a leading space from the token before. So, as
Text Generation Inference does, each step decodes a short window (from the last complete
piece of text on) twice, with and without the new tokens, and emits the difference once it
ends in a whole character. The window starts with the prompt's last tokens, so that the first
new token is decoded in context.

Stop strings end a sequence where they begin (the stop string itself is not part of the
answer), and may span tokens: text that could still turn out to be the start of a stop string
is held back from the stream until it cannot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

PROMPT_CONTEXT_TOKENS = 5
MAX_CHARACTER_TOKENS = 4


class Decoder(Protocol):
    """A tokenizer, as far as turning tokens into text goes."""

    def decode(self, token_ids: Any, skip_special_tokens: bool = ...) -> Any: ...


class TextStream:
    """One sequence's text: `push` each new token, send what it returns; `flush` at the end."""

    def __init__(
        self, decoder: Decoder, prompt_ids: Sequence[int], stop: Sequence[str], special_ids: frozenset[int]
    ) -> None:
        self._decoder = decoder
        self._special = special_ids
        self._ids = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix = 0  # the window decoded each step starts here ...
        self._read = len(self._ids)  # ... and what is before this was emitted as text
        self._stop = tuple(stop)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.text = ""  # the whole answer so far (cut at a stop string once one appeared)
        self.stopped = False  # a stop string appeared: the sequence is done
        self._sent = 0  # characters of `text` handed out so far

    def push(self, token: int) -> str:
        """Take one new token; the text that is now safe to send (often '')."""
        if self.stopped or token in self._special:
            return ""
        self._ids.append(token)
        return self._decode(final=False)

    def flush(self) -> str:
        """The rest of the text, held back until now: the sequence has ended."""
        if not self.stopped:
            self._decode(final=True)
        return self._take(len(self.text))

    def _decode(self, final: bool) -> str:
        before = str(self._decoder.decode(self._ids[self._prefix : self._read], skip_special_tokens=True))
        after = str(self._decoder.decode(self._ids[self._prefix :], skip_special_tokens=True))
        pending = len(self._ids) - self._read
        # A character is at most 4 bytes: tokens that still end in half of one after that are
        # not valid UTF-8, and are sent as the tokenizer decodes them (with replacement characters).
        if (
            not final
            and (len(after) <= len(before) or after.endswith("\ufffd"))
            and pending < MAX_CHARACTER_TOKENS
        ):
            return ""
        checked = max(0, len(self.text) - self._hold)
        self.text += after[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        self._find_stop(checked)
        safe = len(self.text) if self.stopped or final else len(self.text) - self._hold
        return self._take(safe)

    def _find_stop(self, start: int) -> None:
        found = [index for s in self._stop if (index := self.text.find(s, start)) >= 0]
        if found:
            self.text = self.text[: min(found)]
            self.stopped = True

    def _take(self, end: int) -> str:
        if end <= self._sent:
            return ""
        piece = self.text[self._sent : end]
        self._sent = end
        return piece
