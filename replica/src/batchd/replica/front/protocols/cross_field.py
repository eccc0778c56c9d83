"""Rules across a request's fields, in JSON Schema, for the OpenAPI document: what a handler
refuses for a combination of fields, the document says too (null counts as not given, as the
handlers read it), so that no request the document calls valid is refused.
"""

from __future__ import annotations

from typing import Any


def given(field: str) -> dict[str, Any]:
    """JSON Schema: `field` is there and not null (a null field is not given)."""
    return {"required": [field], "properties": {field: {"not": {"type": "null"}}}}


def only_with(field: str, other: str, value: Any) -> dict[str, Any]:
    """JSON Schema: `field` given only where `other` is `value`."""
    return {"if": given(field), "then": {"required": [other], "properties": {other: {"const": value}}}}


def not_both(field: str, other: str) -> dict[str, Any]:
    return {"if": given(field), "then": {"properties": {other: {"type": "null"}}}}
