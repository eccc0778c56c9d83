"""Who owns a child's fields: an earlier batchd's writes folded into the operator's applies.

batchd once wrote its children with merge patches, and the API server recorded the fields they set
as owned by an `Update` of the operator's manager. Server-Side Apply removes only the fields the
applier itself owns and stops sending, so those would stay for ever: a `nodeSelector` dropped from
the spec would stay on the Deployment. Folding the `Update` entry into the manager's `Apply` entry
(what client-go's csaupgrade does for kubectl) makes them the applier's, once. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _union(one: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    """Two FieldsV1 sets (tries of `f:`/`k:`/`v:`/`i:` keys) as one."""
    merged = dict(one)
    for key, value in other.items():
        mine = merged.get(key)
        merged[key] = (
            _union(mine, value) if isinstance(mine, Mapping) and isinstance(value, Mapping) else value
        )
    return merged


def upgraded(managed_fields: Sequence[Mapping[str, Any]], manager: str) -> list[dict[str, Any]] | None:
    """`managed_fields` with `manager`'s Update entries on the object itself (not a subresource)
    folded into its Apply entry; None when it has none to fold."""

    def ours(entry: Mapping[str, Any], operation: str) -> bool:
        return (
            entry.get("manager") == manager
            and entry.get("operation") == operation
            and not entry.get("subresource")
        )

    updates = [entry for entry in managed_fields if ours(entry, "Update")]
    if not updates:
        return None
    applies = [entry for entry in managed_fields if ours(entry, "Apply")]
    fields: dict[str, Any] = {}
    for entry in [*applies, *updates]:
        fields = _union(fields, entry.get("fieldsV1") or {})
    folded = {**(applies or updates)[0], "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": fields}
    rest = [dict(entry) for entry in managed_fields if not (ours(entry, "Update") or ours(entry, "Apply"))]
    return [*rest, folded]
