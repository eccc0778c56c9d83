"""What the generate routes use, whichever way sequences are scheduled.

What every other route gets from the batcher, a generation request gets from a service, with the
same errors from `errors.py` and the same priority classes: 503 with Retry-After when
`max_queued_requests` sequences already wait (or a higher class took its place, or the replica
drains), `batchd-refused: shed` for a sheddable class past half of that, 504 at its deadline
(`waiting`), and a client that leaves frees its sequence at the next step.
`token_level.TokenLevel` serves through the engine (the default);
`request_level.RequestLevel` serves the same requests through the batcher. Both answer `open()`
with a `streams.SequenceStream`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol

from batchd.api.spec import BatchingSpec
from batchd.replica.generation.params import Completion, GenerationRequest
from batchd.replica.generation.preparing import Preparer
from batchd.replica.generation.streams import SequenceStream
from batchd.replica.waiting import NO_CLIENT, Client

if TYPE_CHECKING:  # it holds tensors
    from batchd.replica.generation.prefix_cache import PrefixCache


class GenerationService(Protocol):
    """What the routes use, whether sequences are scheduled by token or by request."""

    preparer: Preparer

    @property
    def scheduling(self) -> Literal["token", "request"]:
        """ "token": sequences have their own queue and rows, and count as items in the replica's
        load; "request": they are the batcher's items."""
        ...

    @property
    def kv_usage(self) -> float:
        """The share of the key-value cache that running sequences hold (0 with none kept)."""
        ...

    @property
    def prefix_cache(self) -> PrefixCache | None:
        """Whole blocks of earlier sequences kept for later prompts (token-level only; else None)."""
        ...

    @property
    def waiting(self) -> int: ...

    @property
    def running(self) -> int: ...

    @property
    def longest_step_s(self) -> float: ...

    @property
    def sheddable(self) -> int:
        """Sequences of sheddable classes it holds apart from the batcher's items (0: none, or
        they are the batcher's)."""
        ...

    def class_depths(self) -> list[tuple[str, int]]:
        """Sequences waiting, by priority class, apart from the batcher's ([]: they are its items)."""
        ...

    def open(self, request: GenerationRequest, client: Client = NO_CLIENT) -> SequenceStream: ...

    async def complete(
        self, requests: Sequence[GenerationRequest], client: Client = NO_CLIENT
    ) -> list[Completion]: ...

    def reconfigure(self, config: BatchingSpec) -> None: ...

    def begin_draining(self) -> None: ...

    async def drain(self) -> None: ...
