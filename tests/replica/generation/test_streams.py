"""A sequence's stream as its consumer sees it: chunk by chunk for a streamed answer, the first chunk
and then the rest at once for a whole one (`complete`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from batchd.replica.errors import DeadlineExceeded
from batchd.replica.generation.params import Chunk, Completion, GenerationParams, GenerationRequest
from batchd.replica.generation.streams import Deliver, SequenceStream
from batchd.replica.waiting import NO_CLIENT

REQUEST = GenerationRequest("Once upon", (1, 2), GenerationParams(max_new_tokens=12))


class Feed:
    """What the engine holds of a stream: the function that delivers its chunks."""

    def __init__(self) -> None:
        self.deliver: Deliver | None = None
        self.cancelled = False

    def start(self, deliver: Deliver) -> Callable[[], None]:
        self.deliver = deliver

        def cancel() -> None:
            self.cancelled = True

        return cancel

    def send(self, *chunks: Chunk) -> None:
        assert self.deliver is not None
        for chunk in chunks:
            self.deliver(chunk)


class FirstTokens:
    def __init__(self) -> None:
        self.seconds: list[float] = []

    def first_token(self, seconds: float, exemplar: dict[str, str] | None = None) -> None:
        self.seconds.append(seconds)

    def sequence_done(self, prompt_tokens: int, generated_tokens: int, per_token_s: float | None) -> None:
        pass


def token(n: int, finish: str | None = None) -> Chunk:
    return Chunk(f" t{n}", (n,), finish)


async def settle() -> None:
    """Let every ready task run (a few loop turns, none of them timed)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def streamed(stream: SequenceStream) -> Completion:
    """The answer as a streaming consumer takes it: each chunk as it comes."""
    chunks = [chunk async for chunk in stream]
    ids = tuple(token for chunk in chunks for token in chunk.token_ids)
    finish = chunks[-1].finish_reason or "length"
    return Completion("".join(chunk.text for chunk in chunks), finish, len(stream.request.prompt_ids), ids)


@pytest.mark.parametrize("whole", [False, True])
async def test_the_answer_is_every_chunk_in_order_and_its_first_token_is_timed_as_it_comes(
    whole: bool,
) -> None:
    feed, observer = Feed(), FirstTokens()
    stream = SequenceStream(feed.start, REQUEST, 30.0, NO_CLIENT, observer)
    async with stream:
        answer = asyncio.ensure_future(stream.complete() if whole else streamed(stream))
        feed.send(token(0))
        await settle()
        assert len(observer.seconds) == 1  # timed when the first chunk came, not with the last
        feed.send(*(token(n) for n in range(1, 11)))
        await settle()
        # A streamed answer's consumer takes each chunk as it comes; a whole one's waits for the rest.
        assert stream.generated_tokens == (1 if whole else 11)
        feed.send(token(11, "length"))
        completion = await answer
    assert completion.text == "".join(f" t{n}" for n in range(12))
    assert completion.token_ids == tuple(range(12)) and completion.finish_reason == "length"
    assert not feed.cancelled


async def test_a_whole_answer_past_its_deadline_is_an_error_and_frees_its_sequence() -> None:
    feed = Feed()
    stream = SequenceStream(feed.start, REQUEST, 0.05, NO_CLIENT, None)
    with pytest.raises(DeadlineExceeded):
        async with stream:
            answer = asyncio.ensure_future(stream.complete())
            feed.send(token(0), token(1))  # the rest never comes
            await answer
    assert feed.cancelled


async def test_an_error_after_the_first_chunk_ends_a_whole_answer() -> None:
    feed = Feed()
    stream = SequenceStream(feed.start, REQUEST, 30.0, NO_CLIENT, None)
    async with stream:
        answer = asyncio.ensure_future(stream.complete())
        feed.send(token(0), token(1), Chunk("", (), "error", RuntimeError("the model failed")))
        with pytest.raises(RuntimeError, match="the model failed"):
            await answer
