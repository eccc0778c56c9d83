"""W3C Trace Context as batchd reads and writes it (`traceparent`, `tracestate`), and the head
sampling decision made from it before anything else is built for a request.

A request that is not recorded must cost next to nothing, so both the router and the replica
decide first, from the request's headers alone, and only a request they record gets a span. This
module is plain Python, with no OpenTelemetry import: the decision runs on every request, and
OpenTelemetry's own extraction (a propagator, a context, a non-recording span) cost the router
and the replica microseconds each on the 99% of requests that 1% sampling leaves unrecorded.

The decisions are the OpenTelemetry SDK's built-in samplers (`OTEL_TRACES_SAMPLER`), made the
same way: parent-based ones follow the caller's sampled flag; a ratio records a trace when its
id falls under the ratio, as the SDK's TraceIdRatioBased does, so that every service sampling at
the same ratio agrees on a trace.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"

# version-trace_id-parent_id-flags; a later version may append fields after another dash.
_TRACEPARENT = re.compile(
    rb"[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^ \t]*)?[ \t]*"
)
MAX_TRACEPARENT_BYTES = 512  # as the SDK's propagator: anything longer is no traceparent
SAMPLED_FLAG = 0x01
_LOW_64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class TraceParent:
    """The caller's span, as its `traceparent` names it, and its `tracestate` (None: none sent)."""

    trace_id: int
    span_id: int
    sampled: bool
    state: bytes | None = None


def parse_traceparent(value: bytes, state: bytes | None = None) -> TraceParent | None:
    """The span a `traceparent` value names; None where it is malformed, as W3C says to treat it
    (a new trace starts)."""
    match = _TRACEPARENT.fullmatch(value) if len(value) <= MAX_TRACEPARENT_BYTES else None
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == b"ff" or (version == b"00" and rest):
        return None
    trace, span = int(trace_id, 16), int(span_id, 16)
    if not trace or not span:
        return None
    return TraceParent(trace, span, bool(int(flags, 16) & SAMPLED_FLAG), state)


def caller_of(headers: Iterable[tuple[bytes, bytes]]) -> TraceParent | None:
    """The caller's span from a request's headers (lower-case names, as ASGI servers and
    httptools hand them); None when it sent none, or none that parses."""
    parent = state = None
    for name, value in headers:
        if name == TRACEPARENT:
            parent = value
        elif name == TRACESTATE:  # several are one list (RFC 9110)
            state = value if state is None else b"%b,%b" % (state, value)
    return None if parent is None else parse_traceparent(parent, state)


def traceparent(trace_id: int, span_id: int, sampled: bool) -> bytes:
    """A `traceparent` value (version 00)."""
    return b"00-%032x-%016x-%02x" % (trace_id, span_id, SAMPLED_FLAG if sampled else 0)


def unrecorded_headers(parent: TraceParent | None) -> bytes:
    """Header lines (`name: value\r\n`) that carry a request nobody records on: in its caller's
    trace (`parent`, with its `tracestate`) where it has one, else in a new one; the flag off."""
    if parent is None:
        return b"traceparent: %b\r\n" % unrecorded_traceparent()
    lines = b"traceparent: %b\r\n" % traceparent(parent.trace_id, parent.span_id, False)
    return lines if parent.state is None else lines + b"tracestate: %b\r\n" % parent.state


def unrecorded_traceparent() -> bytes:
    """The `traceparent` of a request nobody records, so that the next hop follows that decision
    rather than making its own: new random ids, the sampled flag off."""
    return traceparent(random.getrandbits(128) or 1, random.getrandbits(64) or 1, False)


@dataclass(frozen=True, slots=True)
class HeadSampler:
    """Whether a request is recorded: one of the SDK's built-in samplers, decided up front."""

    ratio: float = 1.0  # the share of new traces recorded (and, not parent-based, of all traces)
    parent_based: bool = True  # a request that continues a trace follows its caller's decision
    _bound: int = field(init=False, repr=False, compare=False)  # of a trace id's low 64 bits

    def __post_init__(self) -> None:
        object.__setattr__(self, "_bound", round(min(max(self.ratio, 0.0), 1.0) * (_LOW_64 + 1)))

    def decide(self, parent: TraceParent | None, trusted: bool = True) -> int:
        """The id of the trace a request (continuing `parent`, if any) is recorded in; 0 when it
        is not recorded. A parent's sampled flag counts only from a `trusted` caller: an untrusted
        one's trace is recorded by the ratio on its id, so it can neither force a recording nor
        hide from one."""
        if parent is not None:
            if self.parent_based and trusted:
                return parent.trace_id if parent.sampled else 0
            return parent.trace_id if self._under_ratio(parent.trace_id) else 0
        trace_id = random.getrandbits(128) or 1  # as the SDK draws a new trace's id
        return trace_id if self._under_ratio(trace_id) else 0

    def _under_ratio(self, trace_id: int) -> bool:
        """The SDK's TraceIdRatioBased: the low 64 bits of the trace id under the ratio's share of
        them, so that every service sampling at the same ratio agrees on a trace."""
        return (trace_id & _LOW_64) < self._bound
