"""The benchmark's client: OpenAI requests streamed over aiohttp, with the usage of each answer, in
three shapes of load: a closed loop (capacity), an open loop (latency from when a request was
due), and conversations (each turn sent once the one before was answered, after a pause).

Times are seconds from the start of the load; the time to first token is when the first event
with text arrived.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import aiohttp
import orjson

from batchd.api.headers import FAIRNESS_HEADER
from batchd.bench.kit import streams
from batchd.bench.prefix.workload import Conversation, Job
from batchd.replica.generation.prefix_cache import BLOCK_TOKENS


@dataclass(frozen=True)
class Outcome:
    """One request: when it was due (sent, in a closed loop), its first text, its last event."""

    due_s: float
    first_s: float | None
    done_s: float | None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    new_tokens: int = 0
    turn: int = 0
    error: str | None = None
    client: int = -1  # which client of a closed loop sent it (-1: an open loop's)
    # A conversation's turn: the most of its prompt any replica could have cached, the one that
    # served the turn before (see `reusable_tokens`).
    reusable_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None and self.first_s is not None and self.done_s is not None


async def send(
    session: aiohttp.ClientSession, url: str, job: Job, start: float, due_s: float
) -> tuple[Outcome, str]:
    """The request streamed (with its usage in the last event); its outcome and its text."""
    body = {**job.body, "stream": True, "stream_options": {"include_usage": True}}
    answer = await streams.stream(session, url + job.path, body)
    first = None
    pieces: list[str] = []
    usage: dict[str, object] = {}
    for arrived, payload in answer.events:
        if payload == b"[DONE]":
            continue
        event = orjson.loads(payload)
        if "error" in event:
            return Outcome(due_s, first, None, turn=job.turn, error=str(event["error"])[:200]), ""
        for choice in event.get("choices") or ():
            text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
            if text and first is None:
                first = arrived - start
            pieces.append(text or "")
        usage = event.get("usage") or usage
    if answer.done_s is None:
        return Outcome(due_s, first, None, turn=job.turn, error=answer.error), ""
    done = answer.done_s - start
    details = usage.get("prompt_tokens_details") or {}
    assert isinstance(details, dict)
    outcome = Outcome(
        due_s,
        first if first is not None else done,
        done,
        int(str(usage.get("prompt_tokens", 0))),
        int(details.get("cached_tokens", 0)),
        int(str(usage.get("completion_tokens", 0))),
        job.turn,
    )
    return outcome, "".join(pieces)


def _session(give_up_s: float, caller: str | None) -> aiohttp.ClientSession:
    """Every request as `caller` (the fairness header, which salts the replicas' caches and the
    router's index): subjects that share replicas never hit each other's blocks."""
    return streams.session(give_up_s, {FAIRNESS_HEADER.decode(): caller} if caller else None)


async def closed_loop(
    url: str,
    jobs: Iterator[Job],
    clients: int,
    until_s: float,
    give_up_s: float = 600,
    caller: str | None = None,
) -> list[Outcome]:
    """`clients` clients, each sending its next request when its answer has come, until `until_s`;
    every outcome (the caller keeps the window it measures)."""
    outcomes: list[Outcome] = []
    async with _session(give_up_s, caller) as session:
        start = asyncio.get_running_loop().time()

        async def client(index: int) -> None:
            loop = asyncio.get_running_loop()
            while (now := loop.time() - start) < until_s:
                outcome, _ = await send(session, url, next(jobs), start, now)
                outcomes.append(dataclasses.replace(outcome, client=index))

        await asyncio.gather(*(client(index) for index in range(clients)))
    return outcomes


async def open_loop(
    url: str, timed: Sequence[tuple[float, Job]], give_up_s: float = 600, caller: str | None = None
) -> list[Outcome]:
    """Each job at its due time, whatever the answers do."""
    async with _session(give_up_s, caller) as session:

        async def one(start: float, due_s: float, job: Job) -> Outcome:
            return (await send(session, url, job, start, due_s))[0]

        return await streams.open_loop(timed, one)


def reusable_tokens(prompt_tokens: int, before: Outcome) -> int:
    """The most of a turn's prompt (of `prompt_tokens`) a replica can have cached: the whole blocks
    of the turn before it (its prompt and its answer but the last token, which was never fed back),
    and never the prompt's own last token. The turn's prompt renders that answer again as text, so
    it may share less; this is the bound."""
    held = (before.prompt_tokens + before.new_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS
    return max(0, min(prompt_tokens - 1, held))


def with_reusable(outcome: Outcome, before: Outcome | None) -> Outcome:
    if before is None or not outcome.ok:
        return outcome
    return dataclasses.replace(outcome, reusable_tokens=reusable_tokens(outcome.prompt_tokens, before))


async def conversations(
    url: str,
    started: Sequence[tuple[float, Conversation]],
    new_tokens: int,
    think_s: float,
    seed: int,
    give_up_s: float = 600,
    caller: str | None = None,
) -> list[Outcome]:
    """Each conversation from its start time: every turn sent after the answer to the one before
    and a pause (exponential, of mean `think_s`), its history the answers it got. A turn that fails
    ends its conversation."""
    rng = random.Random(seed)
    outcomes: list[Outcome] = []
    async with _session(give_up_s, caller) as session:

        async def talk(start: float, _: float, talking: tuple[Conversation, list[float]]) -> None:
            loop = asyncio.get_running_loop()
            conversation, pauses = talking
            answers: list[str] = []
            before: Outcome | None = None
            for pause in pauses:
                outcome, text = await send(
                    session, url, conversation.job(answers, new_tokens), start, loop.time() - start
                )
                outcomes.append(outcome := with_reusable(outcome, before))
                if not outcome.ok:
                    return
                answers.append(text)
                before = outcome
                await asyncio.sleep(pause)

        talks: list[tuple[float, tuple[Conversation, list[float]]]] = []
        for at_s, conversation in started:  # every pause drawn first, in order, as the seed says
            pauses = [rng.expovariate(1 / think_s) if think_s else 0.0 for _ in conversation.questions]
            talks.append((at_s, (conversation, pauses)))
        await streams.open_loop(talks, talk)
    return outcomes


async def conversation_loop(
    url: str,
    fresh: Iterator[Conversation],
    slots: int,
    new_tokens: int,
    until_s: float,
    give_up_s: float = 600,
    caller: str | None = None,
) -> list[Outcome]:
    """`slots` conversations at once, each turn sent as soon as the one before is answered, a new
    conversation as soon as one ends, until `until_s` (a closed loop of conversations)."""
    outcomes: list[Outcome] = []
    async with _session(give_up_s, caller) as session:
        start = asyncio.get_running_loop().time()

        async def slot(index: int) -> None:
            loop = asyncio.get_running_loop()
            while loop.time() - start < until_s:
                conversation, answers = next(fresh), list[str]()
                before: Outcome | None = None
                for _ in conversation.questions:
                    job = conversation.job(answers, new_tokens)
                    outcome, text = await send(session, url, job, start, loop.time() - start)
                    outcome = dataclasses.replace(with_reusable(outcome, before), client=index)
                    outcomes.append(outcome)
                    if not outcome.ok or loop.time() - start >= until_s:
                        break
                    answers.append(text)
                    before = outcome

        await asyncio.gather(*(slot(index) for index in range(slots)))
    return outcomes
