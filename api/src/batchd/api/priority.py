"""Which priority class and caller a request names, read one way by the router and the replicas.

A request names its class in the `batchd-priority` header and its caller (for fair shares within
its class) in `batchd-fairness-id`; an OpenAI body also names them in `metadata.priority` and
`user`, which count where the headers say neither. The router (to hold a request in order, to
refuse an unknown class itself) and the replica (to queue it) must read the same class from the
same request, so both call `asked_class` with the deployment's classes (`PriorityClasses`, made
from its `spec.batching`): the same class, or the same 400 naming the class and the ones there are.

The case rule: header names are case-insensitive (HTTP); so is a class name, since every class
name is a DNS label, lower case: `Search` names `search`. A caller is an opaque id, taken as sent.

A composed call (`batchd-called-by`, which a composer's handles send) carries the class of the
request it was made for, a name from the composer's classes: where the callee has no class of
that name, the call is in the callee's default class rather than refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from batchd.api.headers import CALLED_BY_HEADER, FAIRNESS_HEADER, PRIORITY_HEADER
from batchd.api.spec import DEFAULT_PRIORITY_CLASS, BatchingSpec

# The key of an OpenAI body's `metadata` that names the request's class (as batchd-priority does).
PRIORITY_KEY = "priority"
MAX_METADATA_KEYS = 16  # as OpenAI bounds `metadata`
# Where a class is named, for the messages.
WHERE = f"priority class ({PRIORITY_HEADER.decode()} or metadata.{PRIORITY_KEY})"


class PriorityError(ValueError):
    """What a request names as its class or caller cannot be served (a 400); the message names
    the field and the value."""


class UnknownPriorityClass(PriorityError):
    """The request names a class its deployment does not have."""


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """One class of a deployment (`batching.priority_classes[]`)."""

    name: str
    priority: int  # higher goes first; negative: sheddable
    queue_timeout_s: float | None = None  # refused when still queued after it (None: no such limit)

    @property
    def sheddable(self) -> bool:
        return self.priority < 0


@dataclass(frozen=True)
class PriorityClasses:
    """A deployment's priority classes, highest priority first (classes of one priority in the
    order the spec gives them), and the class of a request that names none."""

    classes: tuple[PriorityClass, ...]
    default: PriorityClass
    _by_name: Mapping[str, PriorityClass] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {c.name: c for c in self.classes})

    @classmethod
    def of(cls, batching: BatchingSpec) -> PriorityClasses:
        """The classes `batching` gives (`default` alone, at priority 0, when it gives none)."""
        given = [PriorityClass(c.name, c.priority, c.queue_timeout_s) for c in batching.priority_classes] or [
            PriorityClass(DEFAULT_PRIORITY_CLASS, 0)
        ]
        ordered = tuple(sorted(given, key=lambda c: -c.priority))  # sorted() keeps the spec's order of equals
        by_name = {c.name: c for c in ordered}
        return cls(ordered, by_name[batching.default_priority_class])

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.classes]

    def get(self, name: str) -> PriorityClass | None:
        return self._by_name.get(name)


NO_CLASSES = PriorityClasses.of(BatchingSpec())  # a deployment that names none: `default` alone


def asked_class(
    classes: PriorityClasses,
    priority: str | bytes | None,
    caller: str | bytes | None = None,
    body: object = None,
    *,
    composed: bool = False,
) -> tuple[PriorityClass, str]:
    """The class and the caller ("" for none) a request names: `priority` and `caller` are its
    batchd-priority and batchd-fairness-id values (None: not sent); `body` its OpenAI body, read
    where they are None. No class named: the default class. A class the deployment lacks:
    UnknownPriorityClass naming it and the ones there are, except on a `composed` call (see the
    module's docstring). A malformed body field: PriorityError naming it."""
    if body is not None:
        in_body, user = named_in_body(body)
        priority = in_body if priority is None else priority
        caller = user if caller is None else caller
    who = "" if caller is None else _text(caller)
    if priority is None:
        return classes.default, who
    name = _text(priority).strip().lower()
    found = classes.get(name)
    if found is not None:
        return found, who
    if composed:
        return classes.default, who
    raise UnknownPriorityClass(
        f"{WHERE}: expected one of {', '.join(classes.names)}, got {_text(priority)!r}"
    )


def named_in_headers(headers: Iterable[tuple[bytes, bytes]]) -> tuple[bytes | None, bytes | None, bool]:
    """The batchd-priority and batchd-fairness-id values among `headers` (None where absent), and
    whether the request is a composed call (batchd-called-by); names of any case."""
    priority = caller = None
    composed = False
    for name, value in headers:
        lowered = name.lower()
        if lowered == PRIORITY_HEADER:
            priority = value
        elif lowered == FAIRNESS_HEADER:
            caller = value
        elif lowered == CALLED_BY_HEADER:
            composed = True
    return priority, caller, composed


def named_in_body(body: object) -> tuple[str | None, str | None]:
    """The class an OpenAI body's `metadata.priority` names and its `user` (None where not
    given); PriorityError naming the field unless `metadata` is an object of at most
    MAX_METADATA_KEYS strings and `user` a string."""
    document: Mapping[str, Any] = body if isinstance(body, Mapping) else {}
    metadata = document.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, Mapping)
        and len(metadata) <= MAX_METADATA_KEYS
        and all(isinstance(value, str) for value in metadata.values())
    ):
        raise PriorityError(
            f"metadata: expected an object of at most {MAX_METADATA_KEYS} string values, got {metadata!r:.60}"
        )
    user = document.get("user")
    if user is not None and not isinstance(user, str):
        raise PriorityError(f"user: expected a string, got {user!r:.60}")
    return (metadata or {}).get(PRIORITY_KEY), user


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value
