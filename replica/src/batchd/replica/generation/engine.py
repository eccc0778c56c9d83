"""The scheduler of token-level batching: one thread that steps the model, one token at a time.

Every iteration: sequences the event loop cancelled (client gone, deadline passed) leave;
waiting sequences join while there is a free row (at most `max_running`, the spec's
max_batch_size), in the batcher's order (`queueing`: higher priority levels first, equal classes
and the callers of a class in turns), their prompts in one forward pass (the prefill) that also
makes their first token; then one forward pass makes the next token of every running sequence (a
decoding step). A sequence that is done (its max_new_tokens, the end-of-sequence token, a stop
string) leaves at once and its row is free for the next iteration. What each step made goes to the
event loop in one `call_soon_threadsafe`: the loop only hands chunks of text to the waiting requests.

A new sequence whose prompt begins with blocks of the prefix cache (`prefix_cache`: a system
prompt, the earlier turns of its conversation) gets them copied into its row and prefills only
the rest. A prompt's whole blocks are cached once it is prefilled, so that the requests right
behind it hit them; a sequence that ends (or is paused) leaves the blocks of its answer too, so
that the next turn of its conversation (or its own resumption) hits them.

A waiting sequence of a higher priority level than a running one does not wait for a row to
free: it takes the row of the running sequence of the lowest level (the one that started last),
which is paused, as vLLM preempts by priority. A paused sequence keeps what it generated and its
stream stays open; it is the first to join again when a row is free (ahead of waiting sequences
of its level and below), its prompt and generated tokens in one prefill (vLLM's recomputation,
less what the prefix cache kept of them), and it goes on where it stopped. So a high class's time
to its first token is a step or two whatever the lower classes hold, as a high class in the
batcher waits for no lower one.

Why not transformers' own continuous batching (`generate_batch`, `init_continuous_batching`,
transformers 5.23)? It serves GPT-2 correctly on CPU (greedy output identical to `generate`,
requests added mid-run, cancellation), but without a flash-attention kernel it packs every
running sequence into one row and attends with a block-diagonal mask over all of their keys:
on this machine it made fewer tokens/s than request-level `generate`, and this scheduler about
twice as many as `generate` (docs/performance/generation.md has the figures). It also cannot give
each request its own seed, min_new_tokens or stop strings, switches sampling on and off for all
requests at once, and sizes its cache from free memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from batchd.replica.generation.cache import SlotCache
from batchd.replica.generation.params import Chunk, GenerationParams, GenerationRequest
from batchd.replica.generation.prefix_cache import BLOCK_TOKENS, PrefixCache, extend_keys
from batchd.replica.generation.sampling import generator_for, next_tokens, token_logprobs
from batchd.replica.generation.text import Decoder, TextStream
from batchd.replica.queueing import NO_CALLER, PendingQueue, PriorityClass
from batchd.replica.traces import DecodingTrace, DecodingTracer, RequestTrace

logger = logging.getLogger(__name__)

# New sequences join in one prefill of at most this many tokens (prompts padded to the longest):
# a burst of long prompts is spread over a few iterations instead of stalling every running
# sequence for one very long forward pass.
PREFILL_TOKENS = 4096


# How a sequence is fed, on the event loop: each chunk in order, or the error that ends it.
Deliver = Callable[["Chunk | BaseException"], None]


@dataclass(eq=False)
class SequenceState:
    """One request's sequence: submitted and cancelled by the event loop, run by the engine."""

    request: GenerationRequest
    deliver: Deliver
    cancelled: bool = False  # set by the event loop; the engine drops the sequence at its next step
    priority_class: str = ""  # its class's name ...
    priority: int = 0  # ... and priority: a higher one may take its row
    caller: str = NO_CALLER  # its fairness id, for turns within its class
    salt: str = ""  # whose cached prefixes it may use: its caller's scope (see `prefix_cache`)
    arrived_at: float = field(default_factory=time.monotonic)
    counted_in: Any = None  # the waiting queue's: where it counts while it waits alive
    trace: RequestTrace | None = None  # its request's span, where it is recorded
    # The engine's own:
    started: bool = False  # it has had a row (it may be paused since: it is queued no more)
    joined_at: float = 0.0  # when it last took a row
    generated: int = 0
    tokens: list[int] = field(default_factory=list, repr=False)  # generated, to resume from
    length: int = 0  # tokens in the cache
    last_token: int = 0
    text: TextStream | None = None
    generator: torch.Generator | None = field(default=None, repr=False)
    block_keys: list[bytes] = field(default_factory=list, repr=False)  # of its whole blocks, so far
    cached_slots: list[int] = field(default_factory=list, repr=False)  # found at admission
    cached_tokens: int = 0  # of its context, copied from the prefix cache at its last join

    @property
    def params(self) -> GenerationParams:
        return self.request.params

    @property
    def context_ids(self) -> list[int]:
        """What its prefill reads: the prompt, and what it generated before a pause."""
        return [*self.request.prompt_ids, *self.tokens]

    def abandoned(self) -> bool:
        return self.cancelled


class ClassServedObserver(Protocol):
    """Where the engine reports each sequence's wait for its first row (on the event loop)."""

    def class_served(self, priority_class: str, caller: str, waited_s: float) -> None: ...


class StepObserver(Protocol):
    """Where the engine reports its steps; the metrics module implements it."""

    def step_done(self, kind: str, sequences: int, duration_s: float) -> None: ...


class GenerationEngine:
    """Runs sequences on a causal language model, token by token, in a thread of its own."""

    def __init__(
        self,
        model: Any,
        decoder: Decoder,
        *,
        eos_ids: Sequence[int],
        special_ids: frozenset[int],
        pad_id: int,
        context_tokens: int,
        max_running: int,
        observer: StepObserver | None = None,
        prefix_cache_bytes: int = 0,
    ) -> None:
        self._model = model
        self._device: torch.device = model.device
        self._decoder = decoder
        self._eos = tuple(eos_ids)
        self._special = special_ids
        self._pad = pad_id
        self._cache = SlotCache(max_running, context_tokens)
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.observer = observer  # set once metrics exist
        self.tracer: DecodingTracer | None = None  # set, traced, before the thread starts
        self._decoding: DecodingTrace | None = None  # the engine thread's: the run's span
        self.classes_observer: ClassServedObserver | None = None  # likewise
        # Shared with the event loop (it submits): read and changed under `_wake`'s lock.
        self._waiting: PendingQueue[SequenceState] = PendingQueue()
        self._paused: list[SequenceState] = []  # rows taken by a higher level, highest first
        self._rows: list[SequenceState] = []  # row i of the cache is self._rows[i]
        self._served: list[tuple[str, str, float]] = []  # first rows taken this iteration
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.max_running = max_running
        self.held_tokens = 0  # tokens in the running sequences' contexts (the cache's use)
        self.step_started: float | None = None  # monotonic, while a forward pass runs

    # -- what the event loop calls ---------------------------------------------------------

    @property
    def waiting(self) -> int:
        """Sequences admitted and waiting alive for their first row."""
        return len(self._waiting)

    @property
    def running(self) -> int:
        """Sequences generating, or paused for a higher level."""
        return len(self._rows) + len(self._paused)

    @property
    def free_rows(self) -> int:
        """Rows the next iteration can fill: sequences that take them wait for nobody."""
        return max(0, self.max_running - len(self._rows) - len(self._paused))

    @property
    def sheddable(self) -> int:
        """Sequences of sheddable classes, waiting alive, generating or paused."""
        running = sum(1 for s in (*self._rows, *self._paused) if s.priority < 0)
        return self._waiting.sheddable_live + running

    def depths(self) -> list[tuple[str, int]]:
        """Sequences waiting alive, by priority class."""
        return self._waiting.depths()

    @property
    def capacity_tokens(self) -> int:
        """The bound of the cache: max_running sequences of the model's whole context."""
        return self.max_running * self._cache.max_columns

    @property
    def context_tokens(self) -> int:
        return self._cache.max_columns

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def token_bytes(self) -> int:
        """The bytes of one token's keys and values (known once a forward pass has run)."""
        return self._cache.token_bytes

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="batchd-generation", daemon=True)
        self._thread.start()

    @property
    def queue(self) -> PendingQueue[SequenceState]:
        """The waiting sequences' queue, for its lanes (`lane`); its items are the engine's."""
        return self._waiting

    def make_room(
        self, class_name: str, count: int, max_queued: int
    ) -> tuple[list[tuple[SequenceState, PriorityClass]] | None, int]:
        """Whether `count` sequences of `class_name` may wait now (besides those the free rows take
        at once): the waiting sequences of lower levels that make room for them, out of the queue
        and cancelled (the caller fails their requests), or None when they are refused; and how
        many sequences wait beyond the free rows, as the decision counted them."""
        with self._wake:
            free = self.free_rows
            made = self._waiting.room_for(class_name, count, max_queued, free=free)
            for displaced, _ in made or ():
                displaced.cancelled = True
            return made, max(0, len(self._waiting) - free)

    def submit(self, sequence: SequenceState) -> None:
        """Queue `sequence` in its class as its caller (after `make_room`)."""
        with self._wake:
            self._waiting.push(sequence, sequence.priority_class, sequence.caller)
            self._wake.notify()

    def set_classes(self, classes: Sequence[PriorityClass], default: str, first_come: bool) -> None:
        """Live retuning: the waiting sequences regrouped under these classes."""
        with self._wake:
            if tuple(classes) != self._waiting.classes or first_come != self._waiting.first_come:
                self._waiting = self._waiting.regrouped(classes, default, first_come)

    def cancel(self, sequence: SequenceState) -> None:
        """Free the sequence's row at the next step; it gets no more chunks, and, waiting, it counts
        no more at once."""
        sequence.cancelled = True
        with self._wake:
            self._waiting.forget(sequence)
            self._wake.notify()

    def withdraw(self, sequence: SequenceState) -> bool:
        """Take `sequence` out if it still waits for its first row (its class's queue_timeout_s
        passed): True when it did, and it is cancelled; False when it has started, or left."""
        with self._wake:
            if sequence.started or sequence.counted_in is None:
                return False
            sequence.cancelled = True
            self._waiting.forget(sequence)
            return True

    def set_max_running(self, max_running: int) -> None:
        """Live retuning: at most this many sequences from the next iteration on."""
        self.max_running = max_running
        self._cache.max_rows = max(self._cache.max_rows, max_running)
        with self._wake:
            self._wake.notify()

    def stop(self, timeout_s: float = 30) -> None:
        """End the thread once no sequence is left (the service drains before this)."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    # -- offline use (warm-up, self-check) -------------------------------------------------

    def run_to_completion(self, requests: Sequence[GenerationRequest]) -> list[list[Chunk]]:
        """Run these sequences on the calling thread, before `start`: every chunk of each."""
        chunks: list[list[Chunk]] = [[] for _ in requests]
        first = self._waiting.classes[0].name
        for index, request in enumerate(requests):
            self._waiting.push(SequenceState(request, _appending(chunks[index])), first)
        with torch.inference_mode():
            while self._waiting or self._rows:
                for sequence, chunk in self._iterate():
                    sequence.deliver(chunk)
        self._cache.release()
        return chunks

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._wake:
                    while not self._waiting and not self._rows and not self._paused and not self._stopping:
                        self._cache.release()
                        self._wake.wait()
                    if self._stopping and not self._waiting and not self._rows and not self._paused:
                        return
                try:
                    events = self._iterate()
                except Exception:  # a bug here must not end the thread silently
                    logger.exception("the generation engine failed an iteration")
                    events = self._fail(list(self._rows), RuntimeError("the generation engine failed"))
                served, self._served = self._served, []
                if events or served:
                    self._dispatch(events, served)
                if self._decoding is not None and not self._rows:
                    self._decoding.finished()  # the run is over: nothing is left running
                    self._decoding = None

    def _iterate(self) -> list[tuple[SequenceState, Chunk]]:
        events: list[tuple[SequenceState, Chunk]] = []
        for sequence in [s for s in self._rows if s.cancelled]:
            self._remove(sequence)
        self._paused = [s for s in self._paused if not s.cancelled]
        new = self._admit()
        if new:
            if self.tracer is not None:
                self._trace_joined(new, self.tracer)
            self._prefill(new, events)
            if self._loop is not None:  # serving: their first tokens go now, not after the next step
                served, self._served = self._served, []
                self._dispatch(events, served)
                events = []
            if self._joinable():
                return events  # one came meanwhile that may join now: it does, before the next step
        if self._rows:
            self._decode(events)
        return events

    def _admit(self) -> list[SequenceState]:
        """The sequences that join this iteration: paused ones first, then the waiting ones in the
        queue's order, while a row is free or one of a lower level can be paused for them."""
        new: list[SequenceState] = []
        longest = 0
        with self._wake:
            while True:
                sequence = self._next_to_join()
                if sequence is None:
                    break
                if len(self._rows) + len(new) >= self.max_running and not (
                    sequence.counted_in is not None and self._pause_below(sequence.priority)
                ):
                    break
                length = len(sequence.context_ids) - self._cached_prefix(sequence)
                if new and (len(new) + 1) * max(longest, length) > PREFILL_TOKENS:
                    break
                if sequence.counted_in is None:  # a paused one
                    self._paused.remove(sequence)
                else:
                    (sequence,) = self._waiting.take_live(1)
                if not sequence.started:
                    sequence.started = True
                    waited_s = time.monotonic() - sequence.arrived_at
                    self._served.append((sequence.priority_class, sequence.caller, waited_s))
                new.append(sequence)
                longest = max(longest, length)
        # Matched again once every pause is made: a paused sequence's blocks, stored as it leaves its
        # row, may have evicted blocks matched before it; nothing is stored from here to the copy.
        for sequence in new:
            sequence.cached_tokens = self._cached_prefix(sequence)
            if self.prefix_cache.enabled and not sequence.tokens:  # a prompt, looked up once
                self.prefix_cache.count(len(sequence.request.prompt_ids), sequence.cached_tokens)
        return new

    def _cached_prefix(self, sequence: SequenceState) -> int:
        """How many tokens of the sequence's context the prefix cache holds (its slots kept on the
        sequence): whole blocks, and never the last token, whose forward pass makes the next one."""
        cache = self.prefix_cache
        if not cache.enabled:
            return 0
        context = sequence.context_ids
        keys = extend_keys(sequence.block_keys, context, sequence.salt, cache.secret)
        sequence.cached_slots = cache.match(keys)
        return min(len(sequence.cached_slots) * BLOCK_TOKENS, len(context) - 1)

    def _trace_joined(self, new: list[SequenceState], tracer: DecodingTracer) -> None:
        """The decoding run's span, opened by the first recorded request to join it."""
        # A paused sequence that resumes (it has tokens already) joined the run before.
        first = [s for s in new if not s.tokens]
        recorded = [s.trace for s in first if s.trace is not None]
        if self._decoding is None:
            if not recorded:
                return  # a run nobody records has no span
            self._decoding = tracer.decoding_started(recorded[0])
        self._decoding.joined(recorded, len(first))

    def _joinable(self) -> bool:
        """Whether a waiting sequence could take a row now: one is free, or one of a lower level
        would be paused for it (at most one decoding step in `max_running` is put off for this)."""
        with self._wake:
            if not self._waiting.drop_dead_first():
                return False
            waiting = self._waiting.first()
            assert waiting is not None
            if self._paused and self._paused[0].priority >= waiting.priority:
                return False  # a paused one goes first, and is in no hurry
            if len(self._rows) < self.max_running:
                return True
            lowest = min((s.priority for s in self._rows), default=waiting.priority)
            return not self._waiting.first_come and lowest < waiting.priority

    def _next_to_join(self) -> SequenceState | None:
        """The paused sequence of the highest level, unless a waiting one is of a higher level
        still; else the waiting sequence that goes next; None when none is left."""
        waiting = self._waiting.first() if self._waiting.drop_dead_first() else None
        paused = self._paused[0] if self._paused else None
        if paused is not None and (waiting is None or paused.priority >= waiting.priority):
            return paused
        return waiting

    def _pause_below(self, priority: int) -> bool:
        """Pause the running sequence of the lowest level below `priority` (of those, the one that
        joined last: the least work to redo); whether there was one. None under first come."""
        if self._waiting.first_come:
            return False
        lower = [s for s in self._rows if s.priority < priority]
        if not lower:
            return False
        paused = min(lower, key=lambda s: (s.priority, -s.joined_at))
        self._remove(paused)
        paused.length = 0
        self._paused.append(paused)
        self._paused.sort(key=lambda s: (-s.priority, s.arrived_at))
        return True

    def _prefill(self, new: list[SequenceState], events: list[tuple[SequenceState, Chunk]]) -> None:
        """The new sequences' contexts (a prompt, and a paused one's tokens so far; less what the
        prefix cache holds of each), left-padded, in one forward pass; their next tokens."""
        contexts = [s.context_ids for s in new]
        lengths = [len(context) for context in contexts]
        starts = [s.cached_tokens for s in new]
        first = len(self._rows)
        if any(starts):
            ids, positions, mask = _prefill_after_prefixes(contexts, lengths, starts, self._pad)
            placements = [(first + index, s.cached_slots) for index, s in enumerate(new)]

            def copy(layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
                self.prefix_cache.copy_to(layer, keys, values, placements)

            self._cache.prefill(first, lengths, starts, copy)
        else:
            ids, positions, mask = _prefill_alone(contexts, lengths, self._pad)
            self._cache.prefill(first, lengths)
        self._cache.reserve(
            first + len(new), max(len(s.request.prompt_ids) + s.params.max_new_tokens for s in new)
        )
        for sequence in new:
            sequence.cached_slots = []
        try:
            logits = self._forward("prefill", ids, mask[:, None], positions)
        except Exception as error:
            logger.exception("a prefill of %d sequence(s) failed", len(new))
            events.extend((s, Chunk("", (), "error", error)) for s in new)
            return
        joined = time.monotonic()
        for index, (sequence, length) in enumerate(zip(new, lengths, strict=True)):
            sequence.length = length
            sequence.joined_at = joined
            if sequence.text is None:  # new, not resumed
                sequence.generator = generator_for(sequence.params, self._device)
                sequence.text = TextStream(
                    self._decoder, sequence.request.prompt_ids, sequence.params.stop, self._special
                )
            self.held_tokens += length
            # The context's blocks, at once: the requests right behind it may begin the same way.
            self._keep_blocks(sequence, first + index, contexts[index])
        self._rows.extend(new)
        self._take(new, logits, events)

    def _keep_blocks(self, sequence: SequenceState, row: int, tokens: Sequence[int]) -> None:
        """The whole blocks of `tokens` (whose keys and values are in `row`) into the prefix cache."""
        cache = self.prefix_cache
        if cache.enabled and len(tokens) >= BLOCK_TOKENS:
            keys = extend_keys(sequence.block_keys, tokens, sequence.salt, cache.secret)
            cache.store(keys, row, self._cache.buffers)

    def _decode(self, events: list[tuple[SequenceState, Chunk]]) -> None:
        """One token more for every running sequence."""
        running = list(self._rows)
        positions = torch.tensor([s.length for s in running])
        width = int(positions.max()) + 1
        mask = torch.arange(width)[None, :] <= positions[:, None]
        ids = torch.tensor([s.last_token for s in running])[:, None]
        self._cache.decode(positions.to(self._device), width)
        try:
            logits = self._forward("decode", ids, mask[:, None, None, :], positions[:, None])
        except Exception as error:
            logger.exception("a decoding step of %d sequence(s) failed", len(running))
            events.extend(self._fail(running, error))
            return
        for sequence in running:
            sequence.length += 1
        self.held_tokens += len(running)
        self._take(running, logits, events)

    def _forward(
        self, kind: str, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        started = time.perf_counter()
        self.step_started = time.monotonic()
        try:
            output = self._model(
                input_ids=ids.to(self._device),
                attention_mask=mask.to(self._device),
                position_ids=positions.to(self._device),
                past_key_values=self._cache,
                use_cache=True,
                logits_to_keep=1,
            )
        finally:
            self.step_started = None
        logits: torch.Tensor = output.logits[:, -1]
        seconds = time.perf_counter() - started
        if self.observer is not None:
            self.observer.step_done(kind, ids.shape[0], seconds)
        if self._decoding is not None:
            self._decoding.stepped(kind, ids.shape[0], seconds)
        return logits

    def _take(
        self, sequences: list[SequenceState], logits: torch.Tensor, events: list[tuple[SequenceState, Chunk]]
    ) -> None:
        """Choose each sequence's next token, turn it into text, and end the sequences that are done."""
        tokens = next_tokens(logits, sequences, self._eos)
        scored = token_logprobs(logits, sequences, tokens)
        for row, (sequence, token) in enumerate(zip(sequences, tokens, strict=True)):
            assert sequence.text is not None
            sequence.generated += 1
            sequence.tokens.append(token)
            sequence.last_token = token
            text = sequence.text.push(token)
            finish = None
            if token in self._eos or sequence.text.stopped:
                finish = "stop"
            elif sequence.generated >= sequence.params.max_new_tokens:
                finish = "length"
            if finish is not None:
                text += sequence.text.flush()
                self._remove(sequence)
            logprobs = (scored[row],) if row in scored else ()
            cached = sequence.cached_tokens if sequence.generated == 1 else 0
            events.append((sequence, Chunk(text, (token,), finish, logprobs=logprobs, cached_tokens=cached)))

    def _remove(self, sequence: SequenceState, computed: bool = True) -> None:
        """The sequence leaves (`computed`: its keys and values are whole, and its blocks stay in
        the prefix cache: prompt and answer); the last row moves into its place, so rows stay 0..n-1."""
        index = self._rows.index(sequence)
        if computed and sequence.length >= BLOCK_TOKENS and self.prefix_cache.enabled:
            # In the cache: the prompt and every new token but the last, which was never fed back.
            tokens = sequence.context_ids[: sequence.length]
            self._keep_blocks(sequence, index, tokens)
        last = len(self._rows) - 1
        if index != last:
            moved = self._rows[last]
            self._cache.move_row(last, index, moved.length)
            self._rows[index] = moved
        self._rows.pop()
        self.held_tokens -= sequence.length

    def _fail(
        self, sequences: list[SequenceState], error: BaseException
    ) -> list[tuple[SequenceState, Chunk]]:
        for sequence in sequences:
            if sequence in self._rows:
                self._remove(sequence, computed=False)
        return [(s, Chunk("", (), "error", error)) for s in sequences]

    def _dispatch(
        self, events: list[tuple[SequenceState, Chunk]], served: list[tuple[str, str, float]]
    ) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting any more
            loop.call_soon_threadsafe(_deliver, events, served, self.classes_observer)


def _deliver(
    events: list[tuple[SequenceState, Chunk]],
    served: list[tuple[str, str, float]],
    observer: ClassServedObserver | None,
) -> None:
    for sequence, chunk in events:
        if not sequence.cancelled:
            sequence.deliver(chunk)
    if observer is not None:
        for priority_class, caller, waited_s in served:
            observer.class_served(priority_class, caller, waited_s)


def _appending(chunks: list[Chunk]) -> Deliver:
    def deliver(chunk: Chunk | BaseException) -> None:
        assert isinstance(chunk, Chunk), chunk  # offline, nothing fails a sequence from outside
        chunks.append(chunk)

    return deliver


def _prefill_alone(
    contexts: Sequence[Sequence[int]], lengths: Sequence[int], pad: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ids, positions and mask ([rows, query, key]) of whole contexts, left-padded to the longest:
    each attends to its own tokens only."""
    padded = max(lengths)
    ids = torch.full((len(contexts), padded), pad, dtype=torch.long)
    positions = torch.zeros((len(contexts), padded), dtype=torch.long)
    for index, context in enumerate(contexts):
        start = padded - lengths[index]
        ids[index, start:] = torch.tensor(context)
        positions[index, start:] = torch.arange(lengths[index])
    columns = torch.arange(padded)
    starts = padded - torch.tensor(lengths)
    causal = columns[None, :] <= columns[:, None]  # [query, key]
    mask = causal[None] & (columns[None, None, :] >= starts[:, None, None])
    mask |= torch.eye(padded, dtype=torch.bool)[None]  # padding attends to itself, never to nothing
    return ids, positions, mask


def _prefill_after_prefixes(
    contexts: Sequence[Sequence[int]], lengths: Sequence[int], starts: Sequence[int], pad: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Ids, positions and mask ([rows, query, key]) of the contexts' uncached tokens (from each
    start), left-padded to the longest; keys are the rows' columns 0 to the longest context, where
    the cached tokens are copied: a token attends to every column up to its own position, and
    padding to column 0 (never to nothing)."""
    counts = [length - start for length, start in zip(lengths, starts, strict=True)]
    padded = max(counts)
    ids = torch.full((len(contexts), padded), pad, dtype=torch.long)
    positions = torch.zeros((len(contexts), padded), dtype=torch.long)
    for index, context in enumerate(contexts):
        start = padded - counts[index]
        ids[index, start:] = torch.tensor(context[starts[index] :])
        positions[index, start:] = torch.arange(starts[index], lengths[index])
    columns = torch.arange(max(lengths))
    mask = columns[None, None, :] <= positions[:, :, None]
    return ids, positions, mask
