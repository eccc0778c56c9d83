"""Spans to OTLP/HTTP, encoded straight into protobuf's wire format.

The SDK's OTLP exporter builds a protobuf message object for every span, attribute, link and
value before serialising them, and groups spans by hashing their resource (a JSON dump of it, per
span): on a replica recording every request that was a third of the process's CPU, taken by the
exporting thread from the event loop under the GIL. Here each span is written as bytes directly
(its resource and scope once per export), and the SDK's exporter sends them: the same endpoint,
headers, timeout, compression and TLS settings from the standard environment, the same
`http/protobuf` body. `tests/api/test_otlp.py` holds it to the SDK's encoding.

Own code, because the SDK's encoder alone misses the 100%-sampling goal (0.95x the requests per
second of tracing off): measured on this project's 2-core machine (`python -m batchd.bench.tracing`,
its span part, `bench/results/tracing.md`), the SDK's encoder (protobuf's upb backend) took 54-69 us of
CPU a span and this one 9.5-11 us, where the trivial adder's whole request costs the replica about
80-100 us with tracing off.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind, StatusCode

logger = logging.getLogger(__name__)

# Wire types.
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
# SpanFlags: whether the parent is remote is known, and whether it is.
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200
_U64 = (1 << 64) - 1
_fixed64 = struct.Struct("<Q").pack
_double = struct.Struct("<d").pack
_SMALL = [bytes((n,)) for n in range(0x80)]  # a varint below 128 is its one byte


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _length(payload: bytes) -> bytes:
    """A length-delimited payload's length prefix and the payload."""
    size = len(payload)
    return (_SMALL[size] if size < 0x80 else _varint(size)) + payload


# The tags spans are made of, made once: length-delimited fields by their number ...
_L = [_tag(field, _LEN) for field in range(17)]
# ... and the others by what they are.
_START, _END, _KIND = _tag(7, _I64), _tag(8, _I64), _tag(6, _VARINT)
_FLAGS = _tag(16, _I32) + struct.pack("<I", _HAS_IS_REMOTE)
_REMOTE_FLAGS = _tag(16, _I32) + struct.pack("<I", _HAS_IS_REMOTE | _IS_REMOTE)
_LINK_FLAGS = _tag(6, _I32) + struct.pack("<I", _HAS_IS_REMOTE)
_REMOTE_LINK_FLAGS = _tag(6, _I32) + struct.pack("<I", _HAS_IS_REMOTE | _IS_REMOTE)
_EVENT_TIME, _STATUS_CODE = _tag(1, _I64), _tag(3, _VARINT)
_INT, _DOUBLE, _TRUE, _FALSE = (
    _tag(3, _VARINT),
    _tag(4, _I64),
    _tag(2, _VARINT) + b"\x01",
    _tag(2, _VARINT) + b"\x00",
)
_DROPPED_ATTRIBUTES, _DROPPED_EVENTS, _DROPPED_LINKS = _tag(10, _VARINT), _tag(12, _VARINT), _tag(14, _VARINT)
_EVENT_DROPPED, _LINK_DROPPED = _tag(4, _VARINT), _tag(5, _VARINT)


def _value(value: Any) -> bytes:
    """An AnyValue's fields, as the SDK's encoder maps Python values onto them."""
    if isinstance(value, str):
        return _L[1] + _length(value.encode())
    if isinstance(value, bool):
        return _TRUE if value else _FALSE
    if isinstance(value, int):
        return _INT + _varint(value & _U64)
    if isinstance(value, float):
        return _DOUBLE + _double(value)
    if value is None:
        return b""
    if isinstance(value, bytes):
        return _L[7] + _length(value)
    if isinstance(value, Sequence):
        return _L[5] + _length(b"".join(_L[1] + _length(_value(item)) for item in value))
    if isinstance(value, Mapping):
        return _L[6] + _length(b"".join(_L[1] + _length(_key_value(str(k), v)) for k, v in value.items()))
    raise TypeError(f"an attribute value of type {type(value).__name__}: {value!r}")


def _key_value(key: str, value: Any) -> bytes:
    return _L[1] + _length(key.encode()) + _L[2] + _length(_value(value))


# Encoded attributes by (field, key, type, value): spans repeat the same few (the deployment,
# the route, the status, the outcome). Bounded, since a handler's own spans may not repeat.
_seen: dict[tuple[int, str, type, Any], bytes] = {}
_SEEN_MAX = 4096
_keys: dict[str, bytes] = {}  # a KeyValue's key field and the value's tag, for a float's


def _attributes(field: int, attributes: Mapping[str, Any] | None) -> bytes:
    if not attributes:
        return b""
    tag = _L[field]
    seen = _seen
    out = []
    for key, value in attributes.items():
        kind = type(value)
        if kind is str or kind is int or kind is bool:
            memo = (field, key, kind, value)
            encoded = seen.get(memo)
            if encoded is None:
                encoded = tag + _length(_key_value(key, value))
                if len(seen) < _SEEN_MAX:
                    seen[memo] = encoded
            out.append(encoded)
        elif kind is float:  # a duration: never the same twice, but its key is
            head = _keys.get(key)
            if head is None:
                head = _keys[key] = _L[1] + _length(key.encode()) + _FLOAT_VALUE
            out.append(tag + _FLOAT_KEY_VALUE_LENGTH[len(head)] + head + _double(value))
        else:
            try:
                out.append(tag + _length(_key_value(key, value)))
            except TypeError:
                logger.exception("attribute %s not encoded", key)
    return b"".join(out)


# A float's AnyValue: its tag and 8 bytes, within the KeyValue's value field (11 bytes in all).
_FLOAT_VALUE = _L[2] + _SMALL[9] + _DOUBLE
_FLOAT_KEY_VALUE_LENGTH = [_varint(size + 8) for size in range(300)]
# Span fields of a fixed length: the ids (16 and 8 bytes), the times, the kind, the status.
_TRACE_ID, _SPAN_ID, _PARENT_ID = _L[1] + _SMALL[16], _L[2] + _SMALL[8], _L[4] + _SMALL[8]
_KINDS = {kind: _KIND + _SMALL[kind.value + 1] for kind in SpanKind}  # past UNSPECIFIED
_NO_STATUS = _L[15] + _SMALL[0]


def encode_span(span: ReadableSpan) -> bytes:
    """One Span message (the fields the SDK's encoder sets, from the same data)."""
    context = span.get_span_context()
    assert context is not None
    parent = span.parent
    out = [_TRACE_ID, context.trace_id.to_bytes(16, "big"), _SPAN_ID, context.span_id.to_bytes(8, "big")]
    if context.trace_state:
        out += (_L[3], _length(",".join(f"{k}={v}" for k, v in context.trace_state.items()).encode()))
    if parent is not None:
        out += (_PARENT_ID, parent.span_id.to_bytes(8, "big"))
    out += (_L[5], _length(span.name.encode()), _KINDS[span.kind])
    if span.start_time:
        out += (_START, _fixed64(span.start_time))
    if span.end_time:
        out += (_END, _fixed64(span.end_time))
    out.append(_attributes(9, span.attributes))
    if span.dropped_attributes:
        out += (_DROPPED_ATTRIBUTES, _varint(span.dropped_attributes))
    for event in span.events:
        body = _EVENT_TIME + _fixed64(event.timestamp) + _L[2] + _length(event.name.encode())
        body += _attributes(3, event.attributes)
        if event.dropped_attributes:
            body += _EVENT_DROPPED + _varint(event.dropped_attributes)
        out += (_L[11], _length(body))
    if span.dropped_events:
        out += (_DROPPED_EVENTS, _varint(span.dropped_events))
    for link in span.links:
        linked = link.context
        body = _TRACE_ID + linked.trace_id.to_bytes(16, "big") + _SPAN_ID + linked.span_id.to_bytes(8, "big")
        if link.attributes:
            body += _attributes(4, link.attributes)
        if link.dropped_attributes:
            body += _LINK_DROPPED + _varint(link.dropped_attributes)
        out += (_L[13], _length(body + (_REMOTE_LINK_FLAGS if linked.is_remote else _LINK_FLAGS)))
    if span.dropped_links:
        out += (_DROPPED_LINKS, _varint(span.dropped_links))
    status = span.status
    message, code = status.description, status.status_code
    if message or code is not StatusCode.UNSET:
        body = (_L[2] + _length(message.encode()) if message else b"") + (
            _STATUS_CODE + _SMALL[code.value] if code.value else b""
        )
        out += (_L[15], _length(body))
    else:
        out.append(_NO_STATUS)
    out.append(_REMOTE_FLAGS if parent is not None and parent.is_remote else _FLAGS)
    return b"".join(out)


def _scope(scope: InstrumentationScope | None) -> bytes:
    if scope is None:
        return b""
    out = _L[1] + _length(scope.name.encode())
    if scope.version:
        out += _L[2] + _length(scope.version.encode())
    return out + _attributes(3, scope.attributes)


def _resource(resource: Resource) -> bytes:
    return _attributes(1, resource.attributes)


def encode_spans(spans: Sequence[ReadableSpan]) -> bytes:
    """An ExportTraceServiceRequest: the spans grouped by resource, then by instrumentation scope."""
    groups: dict[int, tuple[Resource, dict[int, tuple[InstrumentationScope | None, list[bytes]]]]] = {}
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope
        scopes = groups.setdefault(id(resource), (resource, {}))[1]
        scopes.setdefault(id(scope), (scope, []))[1].append(_L[2] + _length(encode_span(span)))
    out = []
    for resource, scopes in groups.values():
        body = [_L[1] + _length(_resource(resource))]
        for scope, encoded in scopes.values():
            scope_spans = [_L[1] + _length(_scope(scope)), *encoded]
            if scope is not None and scope.schema_url:
                scope_spans.append(_L[3] + _length(scope.schema_url.encode()))
            body.append(_L[2] + _length(b"".join(scope_spans)))
        if resource.schema_url:
            body.append(_L[3] + _length(resource.schema_url.encode()))
        out.append(_L[1] + _length(b"".join(body)))
    return b"".join(out)


class SpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP exporter (its configuration, session and retries), with the encoding
    above in place of its own."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        try:
            body = encode_spans(spans)
        except Exception:  # a span it cannot encode must not stop the exporting thread
            logger.exception("a batch of %d spans could not be encoded", len(spans))
            return SpanExportResult.FAILURE
        answered = self._client.export(body)
        return SpanExportResult.SUCCESS if answered.success else SpanExportResult.FAILURE
